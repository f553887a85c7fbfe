package io.tidegate.spark.read;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The gateway's read plan of one pinned view: the snapshot's data files (by partition and
 * offsets) and, per partition, the hot range {@code [from, to)} above the tiered watermark.
 * Fetched once per query, on the driver.
 */
public final class ReadPlan {
  final long snapshotId;
  final List<FileSlice> files;
  /** partition → {from, to}. */
  final Map<Integer, long[]> hot;
  /** The table's stored schema when the plan was made. */
  final JsonNode schema;

  private ReadPlan(long snapshotId, List<FileSlice> files, Map<Integer, long[]> hot, JsonNode schema) {
    this.snapshotId = snapshotId;
    this.files = files;
    this.hot = hot;
    this.schema = schema;
  }

  /**
   * The plan the gateway answered; {@code warehouse}: the folder the reader was given (the
   * {@code warehouse} option, or null), where each file's {@code warehouse_path} is looked
   * for first.
   */
  public static ReadPlan of(JsonNode json, String warehouse) {
    Map<Integer, Long> earliest = new TreeMap<>();
    for (Map.Entry<String, JsonNode> e : json.path("earliest_offsets").properties()) {
      earliest.put(Integer.parseInt(e.getKey()), e.getValue().asLong());
    }
    List<FileSlice> files = new ArrayList<>();
    for (JsonNode f : json.path("files")) {
      int p = f.get("partition").asInt();
      long min = f.get("min_offset").asLong();
      long low = earliest.getOrDefault(p, 0L);
      files.add(
          new FileSlice(
              f.get("url").asText(),
              f.get("file_size_bytes").asLong(),
              p,
              min,
              f.get("max_offset").asLong(),
              f.path("record_count").asLong(-1),
              min < low ? low : -1,
              -1,
              inWarehouse(warehouse, f.path("warehouse_path").asText(""))));
    }
    Map<Integer, long[]> hot = new TreeMap<>();
    for (JsonNode r : json.path("hot_ranges")) {
      hot.put(
          r.get("partition").asInt(),
          new long[] {r.get("from_offset").asLong(), r.get("to_offset").asLong()});
    }
    return new ReadPlan(
        json.path("snapshot_id").asLong(0),
        Collections.unmodifiableList(files),
        Collections.unmodifiableMap(hot),
        json.path("schema"));
  }

  /** The hot ranges the filter's partitions and offsets can keep. */
  List<HotSplit> hotSplits(Filters.Bounds bounds) {
    List<HotSplit> out = new ArrayList<>();
    for (Map.Entry<Integer, long[]> e : hot.entrySet()) {
      int p = e.getKey();
      if (!bounds.keeps(p)) {
        continue;
      }
      long lo = Math.max(e.getValue()[0], bounds.low);
      long hi = bounds.high < 0 ? e.getValue()[1] : Math.min(e.getValue()[1], bounds.high);
      if (lo < hi) {
        out.add(new HotSplit(p, lo, hi));
      }
    }
    return out;
  }

  /**
   * A micro-batch's cold part: per partition of {@code end}, the files holding offsets of
   * {@code [start, end)} below the pinned tiered watermark, each cut to that range.
   */
  public List<FileSlice> streamFiles(Map<Integer, Long> start, Map<Integer, Long> end) {
    List<FileSlice> out = new ArrayList<>();
    for (FileSlice f : files) {
      Long hi = end.get(f.partition);
      if (hi == null) {
        continue;
      }
      long lo = Math.max(start.getOrDefault(f.partition, hi), f.low);
      if (f.minOffset >= hi || f.maxOffset < lo) {
        continue;
      }
      out.add(
          new FileSlice(
              f.url, f.size, f.partition, f.minOffset, f.maxOffset, f.recordCount,
              lo > f.minOffset ? lo : -1, hi <= f.maxOffset ? hi : -1, f.local));
    }
    return out;
  }

  /** A micro-batch's hot part: per partition, {@code [start, end)} above the tiered watermark. */
  public List<HotSplit> streamHot(Map<Integer, Long> start, Map<Integer, Long> end) {
    List<HotSplit> out = new ArrayList<>();
    for (Map.Entry<Integer, Long> e : end.entrySet()) {
      int p = e.getKey();
      long hi = e.getValue();
      long[] range = hot.get(p);
      // No hot range: the pinned snapshot holds every offset below the high watermark.
      long lo = Math.max(start.getOrDefault(p, hi), range == null ? hi : range[0]);
      if (lo < hi) {
        out.add(new HotSplit(p, lo, hi));
      }
    }
    return out;
  }

  /** The files the filter's partitions can keep (the gateway pruned the rest already). */
  List<FileSlice> files(Filters.Bounds bounds) {
    List<FileSlice> out = new ArrayList<>();
    for (FileSlice f : files) {
      if (bounds.keeps(f.partition)) {
        out.add(f);
      }
    }
    return out;
  }

  /**
   * A plan file's path in the given warehouse {@code folder} ({@code inside}: its path in the
   * warehouse), or null without either; a path leading out of the folder is ignored.
   */
  static String inWarehouse(String folder, String inside) {
    if (folder == null || folder.isEmpty() || inside.isEmpty()) {
      return null;
    }
    java.nio.file.Path root =
        java.nio.file.Paths.get(folder.replaceFirst("^file://", "")).toAbsolutePath().normalize();
    java.nio.file.Path file = root.resolve(inside).normalize();
    return file.startsWith(root) && !file.equals(root) ? file.toString() : null;
  }
}
