package io.tidegate.spark.read;

import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;

/** Data files read by one task, with Spark's own vectorized Parquet reader. */
final class FilesSplit implements InputPartition {
  private static final long serialVersionUID = 1L;

  final FileSlice[] files;

  FilesSplit(List<FileSlice> files) {
    this.files = files.toArray(new FileSlice[0]);
  }
}
