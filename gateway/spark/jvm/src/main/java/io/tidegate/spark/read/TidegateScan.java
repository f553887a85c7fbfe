package io.tidegate.spark.read;

import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/**
 * A batch read of one pinned view: one split per data file (or group of small files up to
 * {@code split_bytes}) plus one per hot range piece, read columnar. The plan is fetched once,
 * when Spark first asks for the splits, and every split of the query reads that plan.
 */
public final class TidegateScan implements Scan, Batch {
  /** What opening a data file costs, in bytes read (Spark's openCostInBytes). */
  static final long OPEN_COST = 4L << 20;

  private final TidegateScanBuilder builder;
  private final ReadOptions options;
  private final Gateway gateway;
  private final StructType required;
  private final int limit;
  private InputPartition[] splits;

  TidegateScan(
      TidegateScanBuilder builder,
      ReadOptions options,
      Gateway gateway,
      StructType required,
      int limit) {
    this.builder = builder;
    this.options = options;
    this.gateway = gateway;
    this.required = required;
    this.limit = limit;
  }

  @Override
  public StructType readSchema() {
    return required;
  }

  @Override
  public String description() {
    return "tidegate " + gateway.table() + " columns=" + Arrays.toString(required.fieldNames())
        + " pushed=" + Arrays.toString(builder.pushed()) + (limit >= 0 ? " limit=" + limit : "");
  }

  /** Decided by the splits, which are all columnar (data files and hot ranges alike). */
  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return ColumnarSupportMode.PARTITION_DEFINED;
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  /** A streaming read of the same columns; the checkpoint's offsets are all its state. */
  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return builder.streams().open(options, gateway, required, builder.described());
  }

  @Override
  public InputPartition[] planInputPartitions() {
    if (splits == null && builder.keyed()) {
      splits = stateSplits().toArray(new InputPartition[0]);
    }
    if (splits == null) {
      ReadPlan plan = builder.plan();
      checkSchema(plan);
      Filters.Bounds bounds = builder.bounds();
      List<InputPartition> out =
          plan(
              plan.files(bounds),
              plan.hotSplits(bounds),
              options.longValue("split_bytes", 128L << 20, 1),
              options.integer("min_partitions", 2, 1),
              options.longValue("hot_split_records", 1_000_000, 1));
      if (limit >= 0) {
        out = limited(out, limit);
      }
      splits = out.toArray(new InputPartition[0]);
    }
    return splits;
  }

  /** A key table's current state: one split per table partition the filters can keep. */
  private List<InputPartition> stateSplits() {
    Filters.Bounds bounds = builder.bounds();
    String filter = builder.filterText();
    String asOf = options.get("as_of");
    List<InputPartition> out = new ArrayList<>();
    for (int p = 0; p < builder.described().path("partitions").asInt(); p++) {
      if (bounds.keeps(p)) {
        out.add(new StateSplit(p, filter, asOf));
      }
    }
    return out;
  }

  /** Refuse, in one sentence, to read a column whose type changed since the DataFrame loaded. */
  private void checkSchema(ReadPlan plan) {
    if (plan.schema.isMissingNode() || plan.schema.size() == 0) {
      return;
    }
    java.util.Map<String, String> was = typeNames(builder.described().path("schema"));
    java.util.Map<String, String> now = typeNames(plan.schema);
    for (String name : required.fieldNames()) {
      if (!was.containsKey(name)) {
        continue; // a system column
      }
      String current = now.get(name);
      if (current == null || !current.equals(was.get(name))) {
        String change =
            current == null ? "is gone" : "is " + current + " now, was " + was.get(name);
        throw new TidegateException(
            "tidegate: the schema of " + gateway.table() + " changed since the DataFrame was "
                + "loaded (column '" + name + "' " + change + "); load it again",
            "SCHEMA_MISMATCH");
      }
    }
  }

  private static java.util.Map<String, String> typeNames(
      com.fasterxml.jackson.databind.JsonNode fields) {
    java.util.Map<String, String> out = new java.util.HashMap<>();
    for (com.fasterxml.jackson.databind.JsonNode f : fields) {
      String name = f.path("name").asText();
      if (!name.equals(Types.PARTITION) && !name.equals(Types.OFFSET)
          && !name.equals(Types.TIMESTAMP)) {
        out.put(name, f.path("type").asText());
      }
    }
    return out;
  }

  /**
   * Files packed into splits as Spark's file sources pack them (each file counts its size plus
   * {@link #OPEN_COST}; a split holds at most {@code splitBytes} of it, or less when that would
   * leave fewer than {@code minPartitions} splits), then the hot ranges cut into pieces of at
   * most {@code hotSplitRecords}: the Python source's {@code plan_splits}.
   */
  public static List<InputPartition> plan(
      List<FileSlice> files,
      List<HotSplit> hot,
      long splitBytes,
      int minPartitions,
      long hotSplitRecords) {
    long total = 0;
    for (FileSlice f : files) {
      total += f.size + OPEN_COST;
    }
    long perPartition = -Math.floorDiv(-total, Math.max(1, minPartitions));
    long target = Math.min(splitBytes, Math.max(OPEN_COST, perPartition));
    List<InputPartition> out = new ArrayList<>();
    List<FileSlice> group = new ArrayList<>();
    long size = 0;
    for (FileSlice f : files) {
      if (!group.isEmpty() && size + f.size > target) {
        out.add(new FilesSplit(group));
        group = new ArrayList<>();
        size = 0;
      }
      group.add(f);
      size += f.size + OPEN_COST;
    }
    if (!group.isEmpty()) {
      out.add(new FilesSplit(group));
    }
    for (HotSplit h : hot) {
      for (long start = h.start; start < h.end; start += hotSplitRecords) {
        out.add(new HotSplit(h.partition, start, Math.min(h.end, start + hotSplitRecords)));
      }
    }
    return out;
  }

  /** The first splits that hold at least {@code limit} rows (Spark applies the limit). */
  private static List<InputPartition> limited(List<InputPartition> splits, int limit) {
    List<InputPartition> out = new ArrayList<>();
    long rows = 0;
    for (InputPartition s : splits) {
      if (rows >= limit) {
        break;
      }
      out.add(s);
      if (s instanceof HotSplit) {
        rows += ((HotSplit) s).end - ((HotSplit) s).start;
      } else {
        for (FileSlice f : ((FilesSplit) s).files) {
          if (!f.dense()) {
            return splits;
          }
          rows += f.kept();
        }
      }
    }
    return out;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new ReaderFactory(gateway, required, 4096, builder.bounds());
  }
}
