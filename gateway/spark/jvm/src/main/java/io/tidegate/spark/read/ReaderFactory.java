package io.tidegate.spark.read;

import io.tidegate.spark.transport.Gateway;
import java.io.IOException;
import java.util.Iterator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Executors' readers: data files through Spark's vectorized Parquet reader, hot ranges and a
 * key table's partitions (the gateway's scan of its current state) as Arrow from the gateway,
 * all as {@link ColumnarBatch}es of the columns the query needs.
 */
public final class ReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  final Gateway gateway;
  /** The columns Spark wants, in its order. */
  final StructType required;
  /** Rows per batch of a data file. */
  final int batchRows;
  /** What the query's filters say of _partition and _offset: row groups outside are skipped. */
  final Filters.Bounds bounds;
  /**
   * Seconds a hot-range read keeps reconnecting to a gateway that went away (negative: for
   * ever, as streaming reads do by default); batch reads give it 30, as the Python source.
   */
  final double reconnectSeconds;

  ReaderFactory(Gateway gateway, StructType required, int batchRows, Filters.Bounds bounds) {
    this(gateway, required, batchRows, bounds, 30);
  }

  public ReaderFactory(
      Gateway gateway,
      StructType required,
      int batchRows,
      Filters.Bounds bounds,
      double reconnectSeconds) {
    this.gateway = gateway;
    this.required = required;
    this.batchRows = batchRows;
    this.bounds = bounds;
    this.reconnectSeconds = reconnectSeconds;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    if (partition instanceof FilesSplit) {
      return new ParquetFilesReader(this, (FilesSplit) partition);
    }
    if (partition instanceof HotSplit) {
      return new HotRangeReader(this, (HotSplit) partition);
    }
    if (partition instanceof StateSplit) {
      return new StateScanReader(this, (StateSplit) partition);
    }
    return new PartitionReader<ColumnarBatch>() {
      @Override
      public boolean next() {
        return false;
      }

      @Override
      public ColumnarBatch get() {
        throw new IllegalStateException("an empty split has no batch");
      }

      @Override
      public void close() {}
    };
  }

  /** Rows, for a Spark that asks for them: the same batches, row by row. */
  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    PartitionReader<ColumnarBatch> batches = createColumnarReader(partition);
    return new PartitionReader<InternalRow>() {
      private Iterator<InternalRow> rows;
      private InternalRow current;

      @Override
      public boolean next() throws IOException {
        while (rows == null || !rows.hasNext()) {
          if (!batches.next()) {
            return false;
          }
          rows = batches.get().rowIterator();
        }
        current = rows.next();
        return true;
      }

      @Override
      public InternalRow get() {
        return current;
      }

      @Override
      public void close() throws IOException {
        batches.close();
      }
    };
  }
}
