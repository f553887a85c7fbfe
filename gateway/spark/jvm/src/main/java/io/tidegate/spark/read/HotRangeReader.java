package io.tidegate.spark.read;

import io.tidegate.spark.transport.Outage;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpResponse;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * One hot range {@code [start, end)} of a partition, read through the gateway's stream-read
 * route as Arrow IPC and handed to Spark as {@link ColumnarBatch}es of {@link
 * ArrowColumnVector}s over the very buffers received: no row conversion, no copy. Each batch
 * owns its vectors (the buffers are transferred out of the stream's root, not copied): a
 * batch's vectors closed after use must not be the root's, which the next batch loads into
 * (a closed struct vector loses its children).
 */
final class HotRangeReader implements PartitionReader<ColumnarBatch> {
  /** The most records one request asks for (the gateway's default cap per read call). */
  static final long MAX_RECORDS_PER_CALL = 100_000;

  private final ReaderFactory factory;
  private final HotSplit split;
  private final BufferAllocator allocator;
  private long offset;
  private ArrowStreamReader stream;
  private InputStream body;
  private long rowsOfCall;
  private ColumnarBatch current;
  /** Rides the reads through a gateway outage, for the factory's reconnect seconds. */
  private final Outage outage;

  HotRangeReader(ReaderFactory factory, HotSplit split) {
    this.factory = factory;
    this.split = split;
    this.offset = split.start;
    this.outage =
        new Outage(
            factory.gateway.endpoint,
            "tidegate read of " + factory.gateway.table() + " partition " + split.partition,
            factory.reconnectSeconds);
    this.allocator = ArrowUtils.rootAllocator().newChildAllocator(
        "tidegate-hot-" + split.partition + "-" + split.start, 0, Long.MAX_VALUE);
  }

  @Override
  public boolean next() throws IOException {
    closeCurrent();
    while (true) {
      if (stream == null) {
        if (offset >= split.end) {
          return false;
        }
        long from = offset;
        long want = Math.min(split.end - from, MAX_RECORDS_PER_CALL);
        HttpResponse<InputStream> response =
            outage.ride(() -> factory.gateway.records(split.partition, from, want));
        body = response.body();
        stream = new ArrowStreamReader(body, allocator);
        rowsOfCall = 0;
      }
      boolean loaded;
      try {
        loaded = stream.loadNextBatch();
      } catch (IOException e) {
        // The gateway went away mid-call: ask again from the first offset not handed on.
        try {
          closeStream();
        } catch (IOException closing) {
          e.addSuppressed(closing);
        }
        outage.pause(
            new TidegateException(
                "tidegate: reading " + factory.gateway.table() + " partition " + split.partition
                    + " at offset " + offset + ": the gateway went away mid-call (" + e + ")",
                "UNAVAILABLE"));
        continue;
      }
      if (loaded) {
        outage.ok();
        VectorSchemaRoot root = stream.getVectorSchemaRoot();
        int n = root.getRowCount();
        if (n == 0) {
          continue;
        }
        BigIntVector offsets = (BigIntVector) root.getVector(Types.OFFSET);
        long last = offsets.get(n - 1);
        long first = offsets.get(0);
        int keep = n;
        if (last >= split.end) {
          keep = (int) Math.max(0, split.end - first);
        }
        offset = Math.min(last + 1, split.end);
        rowsOfCall += n;
        if (keep > 0) {
          current = batch(root, keep);
          return true;
        }
        continue;
      }
      closeStream();
      if (rowsOfCall == 0) {
        throw new IOException(
            "tidegate: the gateway returned no record of " + factory.gateway.table()
                + " partition " + split.partition + " at offset " + offset
                + " within the planned range; run the query again");
      }
    }
  }

  private ColumnarBatch batch(VectorSchemaRoot root, int rows) {
    StructType required = factory.required;
    ColumnVector[] columns = new ColumnVector[required.length()];
    for (int i = 0; i < columns.length; i++) {
      String name = required.fields()[i].name();
      FieldVector v = root.getVector(name);
      if (v == null) {
        throw new IllegalStateException(
            "tidegate: the gateway's records of " + factory.gateway.table() + " have no column '"
                + name + "'; load the DataFrame again");
      }
      TransferPair owned = v.getTransferPair(allocator);
      owned.transfer();
      columns[i] = new ArrowColumnVector((FieldVector) owned.getTo());
    }
    return new ColumnarBatch(columns, rows);
  }

  private void closeCurrent() {
    if (current != null) {
      current.close();
      current = null;
    }
  }

  @Override
  public ColumnarBatch get() {
    return current;
  }

  private void closeStream() throws IOException {
    if (stream != null) {
      try {
        stream.close();
      } finally {
        stream = null;
        if (body != null) {
          body.close();
          body = null;
        }
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
