package io.tidegate.spark.read;

import org.apache.spark.sql.connector.read.InputPartition;

/** Offsets {@code [start, end)} of one partition, read through the gateway as Arrow. */
final class HotSplit implements InputPartition {
  private static final long serialVersionUID = 1L;

  final int partition;
  final long start;
  final long end;

  HotSplit(int partition, long start, long end) {
    this.partition = partition;
    this.start = start;
    this.end = end;
  }
}
