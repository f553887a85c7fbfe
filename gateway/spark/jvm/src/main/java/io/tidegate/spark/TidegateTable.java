package io.tidegate.spark;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.read.TidegateScanBuilder;
import io.tidegate.spark.stream.TidegateMicroBatchStream;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.transport.Secrets;
import io.tidegate.spark.write.TidegateWriteBuilder;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** One stream-table as a DataFrame loaded it: its schema (or the columns chosen of it). */
final class TidegateTable implements SupportsRead, SupportsWrite {
  private final StructType schema;
  private final Map<String, String> properties;
  /** The table as described at load (null: described when first needed). */
  private JsonNode described;

  TidegateTable(StructType schema, Map<String, String> properties, JsonNode described) {
    this.schema = schema;
    this.properties = properties;
    this.described = described;
  }

  @Override
  public String name() {
    String table = properties.get("table");
    if (table == null) {
      table = properties.get("path");
    }
    return "tidegate " + (table == null ? "" : table);
  }

  @Override
  public Column[] columns() {
    Column[] out = new Column[schema.length()];
    for (int i = 0; i < out.length; i++) {
      StructField f = schema.fields()[i];
      out[i] = Column.create(f.name(), f.dataType(), f.nullable());
    }
    return out;
  }

  /** Spark 4 still reads the schema through this deprecated method in places. */
  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return schema;
  }

  /**
   * Batch and streaming reads and writes of our own (TRUNCATE only so that {@code
   * mode("overwrite")} reaches {@link TidegateWriteBuilder#truncate}, which refuses it in the
   * Python writer's words).
   */
  @Override
  public Set<TableCapability> capabilities() {
    // Spark's analyzer asks this in the session that plans the query, before any plan of
    // it is printed: the session whose printed plans must not show the api_key option.
    Secrets.redactApiKey();
    Set<TableCapability> out =
        EnumSet.of(
            TableCapability.BATCH_READ,
            TableCapability.MICRO_BATCH_READ,
            TableCapability.BATCH_WRITE,
            TableCapability.STREAMING_WRITE,
            TableCapability.TRUNCATE);
    return out;
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    ReadOptions o = new ReadOptions(options);
    Gateway gateway = Gateway.of(o);
    if (described == null) {
      described = gateway.describe();
    }
    return new TidegateScanBuilder(o, gateway, schema, described, TidegateMicroBatchStream::new);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return new TidegateWriteBuilder(info);
  }
}
