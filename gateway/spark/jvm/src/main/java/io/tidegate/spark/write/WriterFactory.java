package io.tidegate.spark.write;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;

/** Executors' writers of one write (batch) or of each micro-batch (streaming). */
final class WriterFactory implements DataWriterFactory, StreamingDataWriterFactory {
  private static final long serialVersionUID = 1L;

  private final WriteTarget target;
  /** Producer ids are {@code spark/<write id>/...}. */
  private final String writeId;

  WriterFactory(WriteTarget target, String writeId) {
    this.target = target;
    this.writeId = writeId;
  }

  @Override
  public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
    return new PartitionWriter(target, writeId, partitionId, null);
  }

  @Override
  public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
    return new PartitionWriter(target, writeId, partitionId, epochId);
  }
}
