package io.tidegate.spark.read;

import io.tidegate.spark.transport.Outage;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpResponse;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * One partition of a primary-key table's current state, read through the gateway's scan as
 * Arrow IPC (the state table's rows merged with the partition's hot changes, filtered and
 * projected by the gateway) and handed to Spark as {@link ColumnarBatch}es over the buffers
 * received, each owning its vectors as {@link HotRangeReader}'s do. A gateway outage before
 * the first batch is ridden by asking again; after it, the task fails (a half-read answer is
 * not resumed: the next scan pins another view).
 */
final class StateScanReader implements PartitionReader<ColumnarBatch> {
  private final ReaderFactory factory;
  private final StateSplit split;
  private final BufferAllocator allocator;
  private final Outage outage;
  /** Whether the pushed filter is sent (false once the gateway refused it: Spark filters). */
  private boolean pushed = true;
  private boolean handedOn;
  private ArrowStreamReader stream;
  private InputStream body;
  private ColumnarBatch current;

  StateScanReader(ReaderFactory factory, StateSplit split) {
    this.factory = factory;
    this.split = split;
    this.outage =
        new Outage(
            factory.gateway.endpoint,
            "tidegate read of " + factory.gateway.table() + " partition " + split.partition,
            factory.reconnectSeconds);
    this.allocator = ArrowUtils.rootAllocator().newChildAllocator(
        "tidegate-state-" + split.partition, 0, Long.MAX_VALUE);
  }

  /** The columns asked of the gateway: Spark's, or one to count rows by when it wants none. */
  private String[] columns() {
    String[] names = factory.required.fieldNames();
    return names.length == 0 ? new String[] {Types.PARTITION} : names;
  }

  private void open() {
    try {
      HttpResponse<InputStream> response =
          outage.ride(() -> factory.gateway.scan(columns(), split.where(pushed), split.asOf));
      body = response.body();
    } catch (TidegateException e) {
      if (!pushed || split.filter == null || !"INVALID_REQUEST".equals(e.reason())) {
        throw e;
      }
      // A predicate the gateway reads otherwise: Spark evaluates every predicate anyway.
      pushed = false;
      open();
      return;
    }
    stream = new ArrowStreamReader(body, allocator);
  }

  @Override
  public boolean next() throws IOException {
    closeCurrent();
    while (true) {
      if (stream == null) {
        open();
      }
      boolean loaded;
      try {
        loaded = stream.loadNextBatch();
      } catch (IOException e) {
        closeStream();
        TidegateException gone =
            new TidegateException(
                "tidegate: scanning " + factory.gateway.table() + " partition " + split.partition
                    + ": the gateway went away mid-answer (" + e + ")",
                "UNAVAILABLE");
        if (handedOn) {
          throw new IOException(gone.getMessage() + "; run the query again", e);
        }
        outage.pause(gone);
        continue;
      }
      if (!loaded) {
        return false;
      }
      outage.ok();
      VectorSchemaRoot root = stream.getVectorSchemaRoot();
      int n = root.getRowCount();
      if (n > 0) {
        current = batch(root, n);
        handedOn = true;
        return true;
      }
    }
  }

  private ColumnarBatch batch(VectorSchemaRoot root, int rows) {
    StructType required = factory.required;
    ColumnVector[] columns = new ColumnVector[required.length()];
    for (int i = 0; i < columns.length; i++) {
      String name = required.fields()[i].name();
      FieldVector v = root.getVector(name);
      if (v == null
          || !DataType.equalsStructurally(
              ArrowUtils.fromArrowField(v.getField()), required.fields()[i].dataType(), true)) {
        throw new TidegateException(
            "tidegate: the schema of " + factory.gateway.table() + " changed since the "
                + "DataFrame was loaded (column '" + name + "' is "
                + (v == null ? "gone" : v.getField().getType() + " now") + "); load it again",
            "SCHEMA_MISMATCH");
      }
      TransferPair owned = v.getTransferPair(allocator);
      owned.transfer();
      columns[i] = new ArrowColumnVector((FieldVector) owned.getTo());
    }
    return new ColumnarBatch(columns, rows);
  }

  @Override
  public ColumnarBatch get() {
    return current;
  }

  private void closeCurrent() {
    if (current != null) {
      current.close();
      current = null;
    }
  }

  private void closeStream() throws IOException {
    try {
      if (stream != null) {
        stream.close();
      }
    } finally {
      stream = null;
      if (body != null) {
        body.close();
        body = null;
      }
    }
  }

  @Override
  public void close() throws IOException {
    try {
      closeCurrent();
      closeStream();
    } finally {
      allocator.close();
    }
  }
}
