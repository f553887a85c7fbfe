package io.tidegate.spark.read;

import io.tidegate.spark.types.Types;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * The current state of one partition of a primary-key table, read through the gateway's scan:
 * the state table's rows merged with the partition's hot changes, one row per live key.
 */
final class StateSplit implements InputPartition {
  private static final long serialVersionUID = 1L;

  final int partition;
  /** The pushed predicates and the {@code partitions} option as a filter text, or null. */
  final String filter;
  /** The state table's snapshot to read alone ({@code as_of}), or null: the current state. */
  final String asOf;

  StateSplit(int partition, String filter, String asOf) {
    this.partition = partition;
    this.filter = filter;
    this.asOf = asOf;
  }

  /** The filter text of this partition's rows: {@code _partition = p} and the pushed one. */
  String where(boolean pushed) {
    String own = Filters.quote(Types.PARTITION) + " = " + partition;
    return pushed && filter != null ? own + " and (" + filter + ")" : own;
  }
}
