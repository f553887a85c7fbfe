package io.tidegate.spark.write;

import java.util.UUID;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;

/**
 * Appends to a stream-table through the gateway's idempotent producer (see {@link
 * PartitionWriter}). Nothing happens at commit: every append was acknowledged durable on its
 * own, and a retried task or a replayed micro-batch is de-duplicated by the gateway; for the
 * same reason Spark's commit coordinator is not needed.
 */
final class TidegateWrite implements Write {
  private final WriteTarget target;
  private final LogicalWriteInfo info;

  TidegateWrite(WriteTarget target, LogicalWriteInfo info) {
    this.target = target;
    this.info = info;
  }

  @Override
  public String description() {
    return "tidegate append to " + target.gateway.table();
  }

  /** What Spark's plans print of the write (never its options). */
  @Override
  public String toString() {
    return description();
  }

  /**
   * A batch write's id: the {@code write_id} option, else one drawn here, on the driver, and
   * shared by every task and attempt of the write.
   */
  @Override
  public BatchWrite toBatch() {
    String id = target.writeId;
    return new Append(
        new WriterFactory(target, id == null ? UUID.randomUUID().toString().replace("-", "") : id));
  }

  /**
   * A streaming write's id: the {@code write_id} option, else the query's id, which its
   * checkpoint keeps (what Spark gives as the write's query id, and the Python writer reads
   * as {@code sql.streaming.queryId}), so a micro-batch replayed after a restart
   * de-duplicates, whichever implementation ran it first.
   */
  @Override
  public StreamingWrite toStreaming() {
    String id = target.writeId;
    return new Append(new WriterFactory(target, id == null ? info.queryId() : id));
  }

  /**
   * The batch write (one producer per Spark partition under the write id) and the streaming
   * write (one per micro-batch and Spark partition) alike: nothing to commit or undo.
   */
  static final class Append implements BatchWrite, StreamingWrite {
    private final WriterFactory writers;

    Append(WriterFactory writers) {
      this.writers = writers;
    }

    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      return writers;
    }

    @Override
    public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
      return writers;
    }

    @Override
    public boolean useCommitCoordinator() {
      return false;
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {}

    @Override
    public void abort(WriterCommitMessage[] messages) {}

    @Override
    public void commit(long epochId, WriterCommitMessage[] messages) {}

    @Override
    public void abort(long epochId, WriterCommitMessage[] messages) {}
  }
}
