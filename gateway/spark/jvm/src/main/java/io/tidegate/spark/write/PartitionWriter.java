package io.tidegate.spark.write;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.arrow.compression.CommonsCompressionFactory;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.ipc.message.IpcOption;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.util.ArrowUtils;

/**
 * One task's appends, as producer {@code spark/<write id>/<Spark partition>} ({@code
 * spark/<write id>/<micro-batch id>/<Spark partition>} in a stream), exactly as the Python
 * writer ({@code gateway/spark/_write.py}) appends: rows routed to table partitions by key (a
 * Spark partition's rows to one table partition when the table has no key), per table
 * partition batches cut at {@code batch_rows} rows or {@code batch_bytes} bytes only, each sent
 * with the next sequence of the producer from 0. A retried attempt over the same rows sends the
 * same batches with the same sequences, which the gateway answers as duplicates.
 *
 * <p>Rows are written into Arrow vectors by Spark's own {@link ArrowWriter} and sent as one
 * zstd-compressed Arrow IPC stream per batch: the table's columns, in its order, of the
 * DataFrame's vectors (the system columns the DataFrame may carry are left out; the gateway
 * assigns them, and widens int and float columns as the table's types ask).
 */
final class PartitionWriter implements DataWriter<InternalRow> {
  private final WriteTarget target;
  private final Producer producer;
  /** The table partition of every row of a table without key columns. */
  private final int spread;

  private final int failAfter;
  private final BufferAllocator allocator;
  private final Schema arrowSchema;
  private final Map<Integer, Pending> pending = new TreeMap<>();
  private final Report report;

  PartitionWriter(WriteTarget target, String writeId, int sparkPartition, Long epoch) {
    this.target = target;
    String id = "spark/" + writeId + (epoch == null ? "" : "/" + epoch) + "/" + sparkPartition;
    this.producer = new Producer(target.gateway, id);
    this.report = new Report(id);
    this.spread = sparkPartition % target.partitions;
    TaskContext task = TaskContext.get();
    int attempt = task == null ? 0 : task.attemptNumber();
    this.failAfter = attempt == 0 ? target.failAfterBatches : 0;
    this.allocator =
        ArrowUtils.rootAllocator().newChildAllocator("tidegate-write-" + id, 0, Long.MAX_VALUE);
    this.arrowSchema = ArrowUtils.toArrowSchema(target.given, "UTC", true, false, false);
  }

  /** One table partition's rows not sent yet, and its next sequence. */
  private final class Pending {
    final VectorSchemaRoot root = VectorSchemaRoot.create(arrowSchema, allocator);
    final ArrowWriter writer = ArrowWriter.create(root);
    int rows;
    long bytes;
    long sequence;
  }

  @Override
  public void write(InternalRow row) throws IOException {
    int p = target.routing == null ? spread : target.routing.partition(row);
    Pending batch = pending.get(p);
    if (batch == null) {
      batch = new Pending();
      pending.put(p, batch);
    }
    batch.writer.write(row);
    batch.rows++;
    batch.bytes += row instanceof UnsafeRow ? ((UnsafeRow) row).getSizeInBytes() : 8L * row.numFields();
    if (batch.rows >= target.batchRows || batch.bytes >= target.batchBytes) {
      send(p, batch);
    }
  }

  private void send(int partition, Pending batch) throws IOException {
    batch.writer.finish();
    VectorSchemaRoot root = batch.root;
    List<Field> fields = new ArrayList<>();
    List<FieldVector> vectors = new ArrayList<>();
    for (int i : target.columns) {
      FieldVector v = root.getVector(i);
      fields.add(v.getField());
      vectors.add(v);
    }
    VectorSchemaRoot table = new VectorSchemaRoot(fields, vectors, root.getRowCount());
    ByteArrayOutputStream body = new ByteArrayOutputStream();
    try (ArrowStreamWriter out =
        new ArrowStreamWriter(
            table,
            null,
            Channels.newChannel(body),
            IpcOption.DEFAULT,
            CommonsCompressionFactory.INSTANCE,
            CompressionUtil.CodecType.ZSTD)) {
      out.start();
      out.writeBatch();
      out.end();
    }
    int rows = batch.rows;
    boolean duplicate = producer.append(partition, batch.sequence, body.toByteArray());
    batch.sequence++;
    batch.writer.reset();
    batch.rows = 0;
    batch.bytes = 0;
    if (duplicate) {
      report.duplicates += rows;
    } else {
      report.appended += rows;
    }
    report.batches++;
    if (failAfter > 0 && report.batches >= failAfter) {
      throw new IOException(
          "tidegate: injected failure after " + failAfter
              + " batches (option test_fail_after_batches)");
    }
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    for (Map.Entry<Integer, Pending> e : pending.entrySet()) {
      if (e.getValue().rows > 0) {
        send(e.getKey(), e.getValue());
      }
    }
    return report;
  }

  @Override
  public void abort() {
    // Nothing to undo: each append is acknowledged on its own, and a retry de-duplicates.
  }

  @Override
  public void close() {
    for (Pending batch : pending.values()) {
      batch.root.close();
    }
    pending.clear();
    allocator.close();
  }

  /** What one task appended: rows stored, and rows the gateway already had. */
  static final class Report implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;

    final String producerId;
    long appended;
    long duplicates;
    int batches;

    Report(String producerId) {
      this.producerId = producerId;
    }

    @Override
    public String toString() {
      return producerId + ": " + appended + " rows appended, " + duplicates + " duplicates";
    }
  }
}
