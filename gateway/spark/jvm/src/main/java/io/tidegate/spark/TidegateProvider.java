package io.tidegate.spark;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.Types;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("tidegate")}: a stream-table of a Tidegate gateway, reached over its HTTP edge.
 * Batch reads (columnar, with column, filter, limit and aggregate pushdown), streaming reads
 * and writes, batch and streaming, are this connector's own; the Python source registered by
 * {@code gateway.spark.register(spark)} is the fallback where the jar cannot be used.
 */
public final class TidegateProvider implements TableProvider, DataSourceRegister {
  /** The table as described by {@link #inferSchema}, for the table made from it. */
  private JsonNode described;

  public TidegateProvider() {}

  @Override
  public String shortName() {
    return "tidegate";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    ReadOptions o = new ReadOptions(options);
    Gateway gateway = Gateway.of(o);
    described = gateway.describe();
    StructType stored = Types.stored(described.path("schema"));
    List<String> names = List.of(stored.fieldNames());
    List<String> chosen = o.columns(names);
    List<StructField> out = new ArrayList<>();
    for (String c : chosen) {
      out.add(stored.apply(c));
    }
    return new StructType(out.toArray(new StructField[0]));
  }

  @Override
  public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
    return new Transform[0];
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new TidegateTable(schema, properties, described);
  }
}
