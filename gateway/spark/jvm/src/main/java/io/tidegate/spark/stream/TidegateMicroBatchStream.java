package io.tidegate.spark.stream;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.read.Filters;
import io.tidegate.spark.read.ReadPlan;
import io.tidegate.spark.read.ReaderFactory;
import io.tidegate.spark.read.TidegateScan;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.Outage;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.CompositeReadLimit;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

/**
 * {@code spark.readStream.format("tidegate")}: micro-batches over a table's partitions, in
 * offset order per partition, with the Python source's offsets ({@link StreamOffsets}),
 * options and semantics ({@code gateway/spark/_stream.py}), so either implementation resumes
 * the other's checkpoint.
 *
 * <p>A micro-batch {@code [start, end)} is planned as a batch read is: the gateway pins a
 * snapshot (one {@code POST /plan} whose filter names each partition's offset range, so only
 * the files holding it come back), the cold part of each range is read from those files by
 * Spark's vectorized Parquet reader, cut to the range, and the part above the pinned tiered
 * watermark as Arrow through the gateway: columnar, whatever tiering commits meanwhile. The
 * offsets are all the state there is: a restarted query re-plans the same ranges, and {@link
 * #commit} has nothing to do (Spark does not call it for the last batch of AvailableNow).
 *
 * <p>The latest offsets are the high watermarks the gateway describes. Through a gateway outage
 * the driver's calls (and the tasks' hot-range reads) wait and reconnect with backoff for
 * {@code reconnectTimeout} seconds (default: for ever), then go on where they were.
 */
public final class TidegateMicroBatchStream
    implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
  private final Gateway gateway;
  /** The columns read, in Spark's order. */
  private final StructType schema;
  /** The partitions read, ascending. */
  private final int[] parts;
  /** {@code startingOffsets}, per partition (see {@link StreamOptions}). */
  private final Map<Integer, Long> starting;
  /** {@code maxRecordsPerTrigger} (0: no bound). */
  private final long maxRows;
  private final long hotSplitRecords;
  private final double reconnectSeconds;
  private final Outage outage;
  /** Trigger.AvailableNow's target: the high watermarks when the query started (or null). */
  private SortedMap<Integer, Long> target;
  /** The high watermarks last described, for Spark's progress reports. */
  private SortedMap<Integer, Long> lastHigh;

  public TidegateMicroBatchStream(
      ReadOptions options, Gateway gateway, StructType schema, JsonNode described) {
    this.gateway = gateway;
    this.schema = schema;
    int count = described.path("partitions").asInt();
    int[] chosen = options.partitions(count);
    if (chosen == null) {
      chosen = new int[count];
      for (int p = 0; p < count; p++) {
        chosen[p] = p;
      }
    }
    this.parts = chosen;
    // Every option is checked here, on the driver, before any micro-batch.
    this.starting = StreamOptions.startingOffsets(options, parts);
    this.maxRows = StreamOptions.maxRecordsPerTrigger(options);
    this.hotSplitRecords = options.longValue("hot_split_records", 1_000_000, 1);
    this.reconnectSeconds = StreamOptions.reconnectTimeout(options);
    this.outage =
        new Outage(gateway.endpoint, "tidegate stream of " + gateway.table(), reconnectSeconds);
  }

  /** Per partition read: {earliest offset, high watermark}, as the gateway describes them. */
  private SortedMap<Integer, long[]> watermarks() {
    JsonNode described = outage.ride(gateway::describe);
    SortedMap<Integer, long[]> all = new TreeMap<>();
    for (JsonNode p : described.path("partition_info")) {
      all.put(
          p.path("partition").asInt(),
          new long[] {p.path("earliest_offset").asLong(), p.path("high_watermark").asLong()});
    }
    SortedMap<Integer, long[]> out = new TreeMap<>();
    SortedMap<Integer, Long> high = new TreeMap<>();
    for (int p : parts) {
      long[] w = all.get(p);
      if (w == null) {
        throw new TidegateException(
            "tidegate: the gateway describes no partition " + p + " of " + gateway.table()
                + "; was the table dropped and made again? Start the query afresh",
            "TABLE_CHANGED");
      }
      out.put(p, w);
      high.put(p, w[1]);
    }
    lastHigh = high;
    return out;
  }

  private SortedMap<Integer, Long> highWatermarks() {
    watermarks();
    return lastHigh;
  }

  @Override
  public Offset initialOffset() {
    SortedMap<Integer, long[]> w = watermarks();
    Map<Integer, Long> out = new TreeMap<>();
    for (int p : parts) {
      long earliest = w.get(p)[0];
      long high = w.get(p)[1];
      long want = starting.get(p);
      if (want == StreamOptions.EARLIEST) {
        out.put(p, earliest);
      } else if (want == StreamOptions.LATEST) {
        out.put(p, high);
      } else {
        if (want < earliest || want > high) {
          throw new TidegateException(
              "tidegate: startingOffsets gives partition " + p + " offset " + want + "; it "
                  + "holds offsets " + earliest + ".." + high + " (the high watermark)");
        }
        out.put(p, want);
      }
    }
    return new StreamOffsets(out);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return maxRows > 0 ? ReadLimit.maxRows(maxRows) : ReadLimit.allAvailable();
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    target = highWatermarks();
  }

  /** Spark calls {@link #latestOffset(Offset, ReadLimit)} on a stream with admission control. */
  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException(
        "tidegate: latestOffset(Offset, ReadLimit) is the method to call on this stream");
  }

  @Override
  public Offset latestOffset(Offset start, ReadLimit limit) {
    Map<Integer, Long> begin = offsets(start);
    Map<Integer, Long> high = target != null ? target : highWatermarks();
    Map<Integer, Long> backlog = new TreeMap<>();
    for (int p : parts) {
      long from = begin.getOrDefault(p, high.get(p));
      backlog.put(p, Math.max(0, high.get(p) - from));
    }
    long most = maxRows(limit);
    if (most >= 0) {
      backlog = shareRows(backlog, most);
    }
    Map<Integer, Long> out = new TreeMap<>();
    for (int p : parts) {
      out.put(p, begin.getOrDefault(p, high.get(p)) + backlog.get(p));
    }
    return new StreamOffsets(out);
  }

  /** The most rows {@code limit} lets a micro-batch read (-1: no bound). */
  private static long maxRows(ReadLimit limit) {
    if (limit instanceof ReadMaxRows) {
      return ((ReadMaxRows) limit).maxRows();
    }
    long most = -1;
    if (limit instanceof CompositeReadLimit) {
      for (ReadLimit l : ((CompositeReadLimit) limit).getReadLimits()) {
        long m = maxRows(l);
        if (m >= 0 && (most < 0 || m < most)) {
          most = m;
        }
      }
    }
    return most;
  }

  /**
   * How many of {@code maxRows} each partition gets: equal shares, and what a partition
   * cannot use goes to the others, so a trigger reads {@code min(maxRows, backlog)} rows (the
   * Python source's {@code share_rows}).
   */
  static Map<Integer, Long> shareRows(Map<Integer, Long> backlog, long maxRows) {
    Map<Integer, Long> given = new TreeMap<>();
    List<Integer> pending = new ArrayList<>();
    for (Map.Entry<Integer, Long> e : new TreeMap<>(backlog).entrySet()) {
      given.put(e.getKey(), 0L);
      if (e.getValue() > 0) {
        pending.add(e.getKey());
      }
    }
    long left = maxRows;
    while (left > 0 && !pending.isEmpty()) {
      long share = Math.max(1, left / pending.size());
      for (Integer p : new ArrayList<>(pending)) {
        long take = Math.min(Math.min(share, backlog.get(p) - given.get(p)), left);
        given.put(p, given.get(p) + take);
        left -= take;
        if (given.get(p).equals(backlog.get(p))) {
          pending.remove(p);
        }
        if (left == 0) {
          break;
        }
      }
    }
    return given;
  }

  @Override
  public Offset reportLatestOffset() {
    return lastHigh == null ? null : new StreamOffsets(lastHigh);
  }

  private Map<Integer, Long> offsets(Offset o) {
    return o instanceof StreamOffsets
        ? ((StreamOffsets) o).next
        : StreamOffsets.parse(o.json(), gateway.table()).next;
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    Map<Integer, Long> stop = offsets(end);
    Map<Integer, Long> from = offsets(start);
    Map<Integer, Long> begin = new TreeMap<>();
    boolean empty = true;
    for (Map.Entry<Integer, Long> e : stop.entrySet()) {
      long b = from.getOrDefault(e.getKey(), e.getValue());
      begin.put(e.getKey(), b);
      empty &= b >= e.getValue();
    }
    if (empty) {
      return new InputPartition[0];
    }
    String filter = rangesFilter(begin, stop);
    ReadPlan plan = outage.ride(() -> ReadPlan.of(gateway.plan(filter, null), gateway.warehouse));
    // One split per file: a micro-batch's files are few and already small.
    List<InputPartition> splits =
        TidegateScan.plan(
            plan.streamFiles(begin, stop), plan.streamHot(begin, stop), 1, 1, hotSplitRecords);
    return splits.toArray(new InputPartition[0]);
  }

  /**
   * {@code ("_partition" = p and "_offset" >= s and "_offset" < e) or ...}: the plan's files
   * pruned to those holding the micro-batch.
   */
  static String rangesFilter(Map<Integer, Long> start, Map<Integer, Long> end) {
    List<String> terms = new ArrayList<>();
    for (Map.Entry<Integer, Long> e : new TreeMap<>(end).entrySet()) {
      long lo = start.get(e.getKey());
      if (lo < e.getValue()) {
        terms.add(
            Filters.quote(Types.PARTITION) + " = " + e.getKey() + " and "
                + Filters.quote(Types.OFFSET) + " >= " + lo + " and "
                + Filters.quote(Types.OFFSET) + " < " + e.getValue());
      }
    }
    if (terms.size() == 1) {
      return terms.get(0);
    }
    return "(" + String.join(") or (", terms) + ")";
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new ReaderFactory(gateway, schema, 4096, Filters.Bounds.ALL, reconnectSeconds);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return StreamOffsets.parse(json, gateway.table());
  }

  /** Nothing to do: the checkpoint's offsets are the only state. */
  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "TidegateMicroBatchStream[" + gateway.table() + "]";
  }
}
