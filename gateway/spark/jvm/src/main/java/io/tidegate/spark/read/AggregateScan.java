package io.tidegate.spark.read;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.LocalScan;
import org.apache.spark.sql.types.StructType;

/** Aggregates answered from the read plan: one row, computed on the driver, no file read. */
final class AggregateScan implements LocalScan {
  private final String table;
  private final StructType schema;
  private final InternalRow row;

  AggregateScan(String table, StructType schema, InternalRow row) {
    this.table = table;
    this.schema = schema;
    this.row = row;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public InternalRow[] rows() {
    return new InternalRow[] {row};
  }

  @Override
  public String description() {
    return "tidegate " + table + " aggregates from the read plan";
  }
}
