package io.tidegate.spark.read;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/**
 * How a scan becomes a streaming read. The micro-batch stream ({@code
 * io.tidegate.spark.stream}) sits above the batch read and reuses its plans and readers, so the
 * scan cannot name it: the table, above both, hands the scan builder this opener instead.
 */
@FunctionalInterface
public interface StreamSource {
  /**
   * Args: the checked options, the table's gateway, the columns read and the table as described
   * at load. Returns: the stream. Raises: {@code TidegateException} on a bad streaming option.
   */
  MicroBatchStream open(
      ReadOptions options, Gateway gateway, StructType required, JsonNode described);
}
