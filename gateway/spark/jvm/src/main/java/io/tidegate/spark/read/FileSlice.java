package io.tidegate.spark.read;

import java.io.Serializable;

/**
 * One data file of the plan, and the offsets {@code [low, high)} to keep from it (-1: no
 * bound on that side).
 */
final class FileSlice implements Serializable {
  private static final long serialVersionUID = 1L;

  final String url;
  final long size;
  final int partition;
  final long minOffset;
  final long maxOffset;
  final long recordCount;
  final long low;
  final long high;
  /**
   * The file in the warehouse folder the reader was given, read instead of {@code url} where
   * the executor finds it at the plan's size; null: always {@code url}.
   */
  final String local;

  FileSlice(
      String url,
      long size,
      int partition,
      long minOffset,
      long maxOffset,
      long recordCount,
      long low,
      long high,
      String local) {
    this.url = url;
    this.size = size;
    this.partition = partition;
    this.minOffset = minOffset;
    this.maxOffset = maxOffset;
    this.recordCount = recordCount;
    this.low = low;
    this.high = high;
    this.local = local;
  }

  /** Where an executor reads it: the local file when it is there at its size, else the URL. */
  String source() {
    if (local != null && new java.io.File(local).length() == size) {
      return local;
    }
    return url;
  }

  /** Whether rows must be cut at {@code low} or {@code high}. */
  boolean clipped() {
    return low >= 0 || high >= 0;
  }

  /** Whether its offsets are dense: one record per offset from min to max. */
  boolean dense() {
    return recordCount == maxOffset - minOffset + 1;
  }

  /** Records kept: exact when {@link #dense()}. */
  long kept() {
    long lo = low < 0 ? minOffset : Math.max(minOffset, low);
    long hi = high < 0 ? maxOffset + 1 : Math.min(maxOffset + 1, high);
    return Math.max(0, hi - lo);
  }

  long firstKept() {
    return low < 0 ? minOffset : Math.max(minOffset, low);
  }

  long lastKept() {
    return high < 0 ? maxOffset : Math.min(maxOffset, high - 1);
  }
}
