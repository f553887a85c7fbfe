package io.tidegate.spark.read;

import io.tidegate.spark.transport.HttpRangeFileSystem;
import io.tidegate.spark.types.SlicedVector;
import io.tidegate.spark.types.Types;
import java.io.IOException;
import java.util.Locale;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapred.FileSplit;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.parquet.filter2.predicate.FilterApi;
import org.apache.parquet.filter2.predicate.FilterPredicate;
import org.apache.parquet.filter2.predicate.Operators;
import org.apache.parquet.hadoop.ParquetInputFormat;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.datasources.parquet.VectorizedParquetRecordReader;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The data files of one split, read by Spark's own {@link VectorizedParquetRecordReader}: only
 * the columns asked for, decoded straight into column vectors. A file that straddles a
 * partition's earliest offset (retention recorded, the file not yet rewritten) also reads
 * {@code _offset} and hands on only the rows from that offset, with no copy.
 */
final class ParquetFilesReader implements PartitionReader<ColumnarBatch> {
  private final ReaderFactory factory;
  private final FilesSplit split;
  private final Configuration conf;
  private int next;
  private VectorizedParquetRecordReader reader;
  private Path path;
  private FileSlice file;
  /** The schema read from the current file: the required columns, then _offset if added. */
  private StructType readSchema;
  private int offsetIndex;
  private ColumnarBatch current;

  ParquetFilesReader(ReaderFactory factory, FilesSplit split) {
    this.factory = factory;
    this.split = split;
    this.conf = configuration();
  }

  /** What Spark's Parquet reader reads from a Hadoop configuration (its session's defaults). */
  private static Configuration configuration() {
    Configuration conf = new Configuration(false);
    conf.setClassLoader(ParquetFilesReader.class.getClassLoader());
    conf.set(
        "parquet.read.support.class",
        "org.apache.spark.sql.execution.datasources.parquet.ParquetReadSupport");
    conf.set("spark.sql.session.timeZone", "UTC");
    conf.setBoolean("spark.sql.caseSensitive", true);
    conf.setBoolean("spark.sql.optimizer.nestedSchemaPruning.enabled", true);
    conf.setBoolean("spark.sql.parquet.binaryAsString", false);
    conf.setBoolean("spark.sql.parquet.int96AsTimestamp", true);
    conf.setBoolean("spark.sql.parquet.inferTimestampNTZ.enabled", true);
    conf.setBoolean("spark.sql.legacy.parquet.nanosAsLong", false);
    conf.set("fs." + HttpRangeFileSystem.SCHEME + ".impl", HttpRangeFileSystem.class.getName());
    conf.setBoolean("fs." + HttpRangeFileSystem.SCHEME + ".impl.disable.cache", true);
    conf.set("fs.file.impl", "org.apache.hadoop.fs.LocalFileSystem");
    return conf;
  }

  @Override
  public boolean next() throws IOException {
    while (true) {
      if (reader == null) {
        if (next >= split.files.length) {
          return false;
        }
        open(split.files[next++]);
      }
      if (reader.nextKeyValue()) {
        ColumnarBatch batch = (ColumnarBatch) reader.getCurrentValue();
        current = file.clipped() ? clip(batch) : narrow(batch, 0, batch.numRows());
        if (current.numRows() > 0) {
          return true;
        }
        continue;
      }
      closeFile();
    }
  }

  private void open(FileSlice f) throws IOException {
    file = f;
    StructType required = factory.required;
    readSchema = required;
    offsetIndex = -1;
    if (f.clipped()) {
      offsetIndex = indexOf(required, Types.OFFSET);
      if (offsetIndex < 0) {
        readSchema = required.add(new StructField(Types.OFFSET, DataTypes.LongType, false,
            org.apache.spark.sql.types.Metadata.empty()));
        offsetIndex = required.length();
      }
    }
    String url = f.source();
    String lower = url.toLowerCase(Locale.ROOT);
    if (lower.startsWith("http://") || lower.startsWith("https://")) {
      path = HttpRangeFileSystem.register(url, f.size);
    } else {
      path = new Path(lower.startsWith("file:") ? url : "file://" + url);
    }
    Configuration c = new Configuration(conf);
    FilterPredicate offsets = offsetPredicate(factory.bounds, f);
    if (offsets != null) {
      // Row groups whose _offset statistics lie outside the query's bounds (or the slice of
      // the file kept, e.g. a micro-batch's range) are not read.
      ParquetInputFormat.setFilterPredicate(c, offsets);
    }
    String json = readSchema.json();
    c.set("org.apache.spark.sql.parquet.row.requested_schema", json);
    c.set("org.apache.spark.sql.parquet.row.attributes", json);
    reader =
        new VectorizedParquetRecordReader(
            null, "CORRECTED", "UTC", "CORRECTED", "UTC", false, factory.batchRows);
    try {
      reader.initialize(
          new FileSplit(path, 0, f.size, new String[0]),
          new TaskAttemptContextImpl(c, new TaskAttemptID()));
      reader.initBatch(new StructType(), new GenericInternalRow(new Object[0]));
      reader.enableReturningBatches();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("tidegate: interrupted opening a data file", e);
    } catch (IOException | RuntimeException e) {
      closeFile();
      throw new IOException(
          "tidegate: cannot read data file " + describe(f) + " of the plan: " + e.getMessage(), e);
    }
  }

  /**
   * The _offset range of the bounds and of the file's slice, as a Parquet predicate (null:
   * unbounded).
   */
  static FilterPredicate offsetPredicate(Filters.Bounds bounds, FileSlice f) {
    Operators.LongColumn column = FilterApi.longColumn(Types.OFFSET);
    FilterPredicate out = null;
    long low = Math.max(bounds.low, f.low);
    long high = bounds.high < 0 ? f.high : f.high < 0 ? bounds.high : Math.min(bounds.high, f.high);
    if (low > 0) {
      out = FilterApi.gtEq(column, Long.valueOf(low));
    }
    if (high >= 0) {
      FilterPredicate below = FilterApi.lt(column, Long.valueOf(high));
      out = out == null ? below : FilterApi.and(out, below);
    }
    return out;
  }

  private static String describe(FileSlice f) {
    return "of partition " + f.partition + " (offsets " + f.minOffset + ".." + f.maxOffset + ")";
  }

  private static int indexOf(StructType schema, String name) {
    String[] names = schema.fieldNames();
    for (int i = 0; i < names.length; i++) {
      if (names[i].equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /** The rows of {@code batch} whose offsets the file's slice keeps (a contiguous run). */
  private ColumnarBatch clip(ColumnarBatch batch) {
    ColumnVector offsets = batch.column(offsetIndex);
    int n = batch.numRows();
    int from = 0;
    int to = n;
    long low = file.low;
    long high = file.high;
    long previous = Long.MIN_VALUE;
    for (int i = 0; i < n; i++) {
      long o = offsets.getLong(i);
      if (o < previous) {
        throw new IllegalStateException(
            "tidegate: data file " + describe(file) + " is not sorted by _offset");
      }
      previous = o;
      if (low >= 0 && o < low) {
        from = i + 1;
      }
      if (high >= 0 && o >= high && to == n) {
        to = i;
      }
    }
    return narrow(batch, from, Math.max(from, to));
  }

  /** Rows {@code [from, to)} of the required columns of {@code batch}. */
  private ColumnarBatch narrow(ColumnarBatch batch, int from, int to) {
    int width = factory.required.length();
    if (from == 0 && to == batch.numRows() && batch.numCols() == width) {
      return batch;
    }
    ColumnVector[] columns = new ColumnVector[width];
    for (int i = 0; i < width; i++) {
      columns[i] = from == 0 ? batch.column(i) : new SlicedVector(batch.column(i), from);
    }
    return new ColumnarBatch(columns, to - from);
  }

  @Override
  public ColumnarBatch get() {
    return current;
  }

  private void closeFile() throws IOException {
    if (reader != null) {
      try {
        reader.close();
      } finally {
        reader = null;
        if (path != null && HttpRangeFileSystem.SCHEME.equals(path.toUri().getScheme())) {
          HttpRangeFileSystem.unregister(path);
        }
        path = null;
      }
    }
  }

  @Override
  public void close() throws IOException {
    closeFile();
  }
}
