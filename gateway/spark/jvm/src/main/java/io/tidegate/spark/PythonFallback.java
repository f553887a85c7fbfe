package io.tidegate.spark;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;

/**
 * The Spark shim of this connector (Spark 4.x): writes of {@code format("tidegate")} run the
 * Python source, registered by {@code gateway.spark.register(spark)} under {@value #NAME},
 * through Spark's own {@link PythonDataSourceV2}, the class Spark uses for every Python data
 * source. The same options and idempotent producer as with the Python source alone.
 */
final class PythonFallback {
  /** The name {@code gateway.spark.register} gives the Python source. */
  static final String NAME = "tidegate_python";

  private PythonFallback() {}

  static Table table(StructType schema, Map<String, String> properties) {
    PythonDataSourceV2 source = new PythonDataSourceV2();
    source.setShortName(NAME);
    return source.getTable(schema, new Transform[0], properties);
  }

  static SupportsRead readable(StructType schema, Map<String, String> properties) {
    return (SupportsRead) table(schema, properties);
  }

  static SupportsWrite writable(StructType schema, Map<String, String> properties) {
    return (SupportsWrite) table(schema, properties);
  }
}
