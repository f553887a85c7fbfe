package io.tidegate.spark.read;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.expressions.aggregate.Max;
import org.apache.spark.sql.connector.expressions.aggregate.Min;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownLimit;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * One query's scan, built by Spark's pushdown rules: the columns it needs, the predicates it
 * can prune with, a limit, and {@code count(*)} / min / max of {@code _partition} and {@code
 * _offset} answered from the read plan when that answer is exact. All of it lives on this
 * builder and the scan it builds, never on the table, so a DataFrame queried twice with
 * different filters plans each query afresh.
 */
public final class TidegateScanBuilder
    implements ScanBuilder,
        SupportsPushDownRequiredColumns,
        SupportsPushDownV2Filters,
        SupportsPushDownLimit,
        SupportsPushDownAggregates {
  private final ReadOptions options;
  private final Gateway gateway;
  private final JsonNode described;
  /** Opens the streaming read of {@link TidegateScan#toMicroBatchStream}. */
  private final StreamSource streams;
  private final int[] partitions;
  private StructType required;
  private Predicate[] pushed = new Predicate[0];
  private int limit = -1;
  private ReadPlan plan;
  private InternalRow aggregated;
  private StructType aggregatedSchema;

  public TidegateScanBuilder(
      ReadOptions options,
      Gateway gateway,
      StructType schema,
      JsonNode described,
      StreamSource streams) {
    this.options = options;
    this.streams = streams;
    this.gateway = gateway;
    this.described = described;
    StructType stored = Types.stored(described.path("schema"));
    List<String> unknown = new ArrayList<>();
    for (String name : schema.fieldNames()) {
      if (!List.of(stored.fieldNames()).contains(name)) {
        unknown.add(name);
      }
    }
    if (!unknown.isEmpty()) {
      throw new TidegateException(
          "tidegate: the schema given names unknown column(s) " + ReadOptions.pyList(unknown)
              + "; " + gateway.table() + " has " + ReadOptions.pyList(List.of(stored.fieldNames())));
    }
    this.required = schema;
    this.partitions = options.partitions(described.path("partitions").asInt());
    // Numbers are checked on the driver, before any task runs.
    options.longValue("split_bytes", 128L << 20, 1);
    options.integer("min_partitions", 2, 1);
    options.longValue("hot_split_records", 1_000_000, 1);
  }

  @Override
  public Predicate[] pushPredicates(Predicate[] predicates) {
    List<Predicate> kept = new ArrayList<>();
    StructType stored = Types.stored(described.path("schema"));
    for (Predicate p : predicates) {
      if (Filters.node(p, stored) != null) {
        kept.add(p);
      }
    }
    pushed = kept.toArray(new Predicate[0]);
    // Spark evaluates every predicate again on the rows read: pruning is all we do.
    return predicates;
  }

  @Override
  public Predicate[] pushedPredicates() {
    return pushed;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    required = requiredSchema;
  }

  @Override
  public boolean pushLimit(int n) {
    limit = n;
    return true;
  }

  @Override
  public boolean isPartiallyPushed() {
    return true;
  }

  /** The plan of this query: fetched once, at first need. */
  ReadPlan plan() {
    if (plan == null) {
      plan = fetchPlan(gateway, filterText(), options.get("as_of"));
    }
    return plan;
  }

  /**
   * Whether the table has a primary key: a batch read answers its current state, one {@link
   * StateSplit} per table partition scanned by the gateway (a read plan's hot ranges hold
   * changes, not rows; docs/decisions/primary-keys.md, "Spark reads of a key table").
   */
  boolean keyed() {
    return described.path("primary_key").size() > 0;
  }

  /** The pushed predicates and the {@code partitions} option as one filter text (or null). */
  String filterText() {
    String text = Filters.text(pushed, Types.stored(described.path("schema")));
    if (partitions != null) {
      StringBuilder in = new StringBuilder(Filters.quote(Types.PARTITION) + " in (");
      for (int i = 0; i < partitions.length; i++) {
        in.append(i == 0 ? "" : ", ").append(partitions[i]);
      }
      in.append(')');
      text = text == null ? in.toString() : "(" + in + ") and (" + text + ")";
    }
    return text;
  }

  /**
   * The gateway's plan; a filter the gateway cannot use (a type it reads otherwise) is left
   * out, since Spark evaluates every predicate anyway.
   */
  static ReadPlan fetchPlan(Gateway gateway, String filter, String asOf) {
    try {
      return ReadPlan.of(gateway.plan(filter, asOf), gateway.warehouse);
    } catch (TidegateException e) {
      if (filter == null || !"INVALID_REQUEST".equals(e.reason())) {
        throw e;
      }
      return ReadPlan.of(gateway.plan(null, asOf), gateway.warehouse);
    }
  }

  Filters.Bounds bounds() {
    return Filters.bounds(pushed).withPartitions(partitions);
  }

  // ---- aggregates -------------------------------------------------------------------------

  private static String systemColumn(Expression e) {
    if (!(e instanceof NamedReference)) {
      return null;
    }
    String[] names = ((NamedReference) e).fieldNames();
    return names.length == 1 ? names[0] : null;
  }

  /** Whether every aggregate is one the plan answers: count(*), min/max of offsets. */
  private static boolean answerable(Aggregation aggregation) {
    if (aggregation.groupByExpressions().length != 0) {
      return false;
    }
    for (AggregateFunc f : aggregation.aggregateExpressions()) {
      if (f instanceof CountStar) {
        continue;
      }
      if (f instanceof Count) {
        Count c = (Count) f;
        String col = systemColumn(c.column());
        if (!c.isDistinct() && (Types.PARTITION.equals(col) || Types.OFFSET.equals(col))) {
          continue;
        }
        return false;
      }
      Expression column =
          f instanceof Min ? ((Min) f).column() : f instanceof Max ? ((Max) f).column() : null;
      String col = systemColumn(column);
      if (!Types.PARTITION.equals(col) && !Types.OFFSET.equals(col)) {
        return false;
      }
    }
    return true;
  }

  /** A key table's counts are of live keys, which no plan holds: Spark counts the rows read. */
  @Override
  public boolean supportCompletePushDown(Aggregation aggregation) {
    return !keyed() && answerable(aggregation);
  }

  @Override
  public boolean pushAggregation(Aggregation aggregation) {
    if (keyed() || !answerable(aggregation) || pushed.length != 0) {
      return false;
    }
    ReadPlan p = plan();
    Filters.Bounds bounds = bounds();
    // Per partition: records kept and the first and last offset kept.
    java.util.Map<Integer, long[]> per = new java.util.TreeMap<>();
    for (FileSlice f : p.files(bounds)) {
      if (!f.dense()) {
        return false; // not exact: a scan answers
      }
      if (f.kept() > 0) {
        merge(per, f.partition, f.kept(), f.firstKept(), f.lastKept());
      }
    }
    for (HotSplit h : p.hotSplits(bounds)) {
      merge(per, h.partition, h.end - h.start, h.start, h.end - 1);
    }
    AggregateFunc[] funcs = aggregation.aggregateExpressions();
    Object[] values = new Object[funcs.length];
    StructField[] fields = new StructField[funcs.length];
    for (int i = 0; i < funcs.length; i++) {
      AggregateFunc f = funcs[i];
      if (f instanceof CountStar || f instanceof Count) {
        long n = 0;
        for (long[] v : per.values()) {
          n += v[0];
        }
        values[i] = n;
        fields[i] = field("count" + i, DataTypes.LongType, false);
        continue;
      }
      boolean min = f instanceof Min;
      String col = systemColumn(min ? ((Min) f).column() : ((Max) f).column());
      boolean partition = Types.PARTITION.equals(col);
      DataType type = partition ? DataTypes.IntegerType : DataTypes.LongType;
      Long best = null;
      for (java.util.Map.Entry<Integer, long[]> e : per.entrySet()) {
        long v = partition ? e.getKey() : (min ? e.getValue()[1] : e.getValue()[2]);
        if (best == null || (min ? v < best : v > best)) {
          best = v;
        }
      }
      values[i] = best == null ? null : (partition ? (Object) best.intValue() : (Object) best);
      fields[i] = field((min ? "min" : "max") + i, type, true);
    }
    aggregated = new GenericInternalRow(values);
    aggregatedSchema = new StructType(fields);
    return true;
  }

  private static StructField field(String name, DataType type, boolean nullable) {
    return new StructField(name, type, nullable, Metadata.empty());
  }

  private static void merge(
      java.util.Map<Integer, long[]> per, int partition, long count, long first, long last) {
    long[] v = per.get(partition);
    if (v == null) {
      per.put(partition, new long[] {count, first, last});
    } else {
      v[0] += count;
      v[1] = Math.min(v[1], first);
      v[2] = Math.max(v[2], last);
    }
  }

  @Override
  public Scan build() {
    if (aggregated != null) {
      return new AggregateScan(gateway.table(), aggregatedSchema, aggregated);
    }
    return new TidegateScan(this, options, gateway, required, limit);
  }

  JsonNode described() {
    return described;
  }

  StreamSource streams() {
    return streams;
  }

  Predicate[] pushed() {
    return pushed;
  }
}
