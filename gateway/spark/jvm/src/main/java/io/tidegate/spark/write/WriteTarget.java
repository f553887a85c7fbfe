package io.tidegate.spark.write;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import io.tidegate.spark.types.Types;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimeType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;

/**
 * What every task of one write needs: the table, the DataFrame's columns it takes (in the
 * table's order), the key routing and the batch sizes. Made on the driver, where the
 * DataFrame's schema is checked against the table's with the Python writer's rules and words
 * ({@code conform_batch} of {@code gateway/wire/schema.py}), so a mismatch fails the write
 * before any task appends.
 */
final class WriteTarget implements Serializable {
  private static final long serialVersionUID = 1L;

  private static final Set<String> SYSTEM = Set.of(Types.PARTITION, Types.OFFSET, Types.TIMESTAMP);

  final Gateway gateway;
  /** The DataFrame's schema, system columns included (the rows as Spark hands them). */
  final StructType given;
  /** The ordinal in {@link #given} of each table column, in the table's order. */
  final int[] columns;

  final int partitions;
  /** Null for a table without key columns. */
  final KeyRouting routing;

  /** The {@code write_id} option (null: none given). */
  final String writeId;

  final int batchRows;
  final long batchBytes;
  /** Fault injection for tests: the first attempt of each task fails after this many batches. */
  final int failAfterBatches;

  private WriteTarget(
      Gateway gateway,
      StructType given,
      int[] columns,
      int partitions,
      KeyRouting routing,
      ReadOptions options) {
    this.gateway = gateway;
    this.given = given;
    this.columns = columns;
    this.partitions = partitions;
    this.routing = routing;
    this.writeId = options.get("write_id");
    this.batchRows = options.integer("batch_rows", 10_000, 1);
    this.batchBytes = options.longValue("batch_bytes", 4L << 20, 1);
    this.failAfterBatches = options.integer("test_fail_after_batches", 0, 0);
  }

  /** The target of writing rows of schema {@code given} to the table {@code options} name. */
  static WriteTarget of(ReadOptions options, StructType given) {
    Gateway gateway = Gateway.of(options);
    JsonNode described = gateway.describe();
    Map<String, Integer> at = new HashMap<>();
    List<String> names = new ArrayList<>();
    boolean twice = false;
    for (int i = 0; i < given.fields().length; i++) {
      String name = given.fields()[i].name();
      if (SYSTEM.contains(name)) {
        continue;
      }
      twice |= at.put(name, i) != null;
      names.add(name);
    }
    String what = "tidegate: writing to " + gateway.table() + ": ";
    if (twice) {
      throw new TidegateException(what + "the rows name a column more than once", "SCHEMA_MISMATCH");
    }
    JsonNode fields = described.path("schema");
    List<String> want = new ArrayList<>();
    for (JsonNode f : fields) {
      want.add(f.get("name").asText());
    }
    List<String> extra = new ArrayList<>();
    for (String n : names) {
      if (!want.contains(n)) {
        extra.add(n);
      }
    }
    List<String> missing = new ArrayList<>();
    List<String> mistyped = new ArrayList<>();
    for (JsonNode f : fields) {
      String name = f.get("name").asText();
      String type = f.get("type").asText();
      Integer i = at.get(name);
      if (i == null) {
        missing.add(name);
      } else if (!fits(given.fields()[i].dataType(), type)) {
        mistyped.add(
            "'" + name + "' is " + arrowName(given.fields()[i].dataType(), name) + ", expected "
                + type);
      }
    }
    List<String> problems = new ArrayList<>();
    if (!extra.isEmpty()) {
      problems.add("unexpected column(s) " + ReadOptions.pyList(extra));
    }
    if (!missing.isEmpty()) {
      problems.add("missing column(s) " + ReadOptions.pyList(missing));
    }
    if (!mistyped.isEmpty()) {
      problems.add("mistyped column(s): " + String.join("; ", mistyped));
    }
    if (!problems.isEmpty()) {
      throw new TidegateException(
          what + "rows do not match the table schema: " + String.join(", ", problems),
          "SCHEMA_MISMATCH");
    }
    int[] columns = new int[want.size()];
    for (int k = 0; k < columns.length; k++) {
      columns[k] = at.get(want.get(k));
    }
    int partitions = described.path("partitions").asInt();
    KeyRouting routing = null;
    JsonNode keys = described.path("key_columns");
    if (keys.size() > 0) {
      int[] ordinals = new int[keys.size()];
      DataType[] types = new DataType[keys.size()];
      for (int k = 0; k < ordinals.length; k++) {
        ordinals[k] = at.get(keys.get(k).asText());
        types[k] = given.fields()[ordinals[k]].dataType();
      }
      routing = new KeyRouting(ordinals, types, partitions);
    }
    return new WriteTarget(gateway, given, columns, partitions, routing, options);
  }

  /**
   * Whether a column of Spark type {@code got} may be stored in a column of the table's type
   * {@code want} (an Arrow type name): the same type, or a lossless widening of it, as {@code
   * gateway.wire.schema._compatible} admits (nullability aside: the gateway checks values).
   */
  private static boolean fits(DataType got, String want) {
    DataType table;
    try {
      table = Types.parse(want);
    } catch (TidegateException unreadable) {
      return false; // time64[us]: no Spark type is written as it (TimeType is time64[ns])
    }
    return fits(got, table);
  }

  private static boolean fits(DataType got, DataType want) {
    if (got instanceof ArrayType && want instanceof ArrayType) {
      return fits(((ArrayType) got).elementType(), ((ArrayType) want).elementType());
    }
    if (got instanceof StructType && want instanceof StructType) {
      StructField[] g = ((StructType) got).fields();
      StructField[] w = ((StructType) want).fields();
      if (g.length != w.length) {
        return false;
      }
      for (int i = 0; i < g.length; i++) {
        if (!g[i].name().equals(w[i].name()) || !fits(g[i].dataType(), w[i].dataType())) {
          return false;
        }
      }
      return true;
    }
    if (got instanceof StringType || want instanceof StringType) {
      return got instanceof StringType && want instanceof StringType;
    }
    if (got.equals(want)) {
      return true;
    }
    int from = width(got);
    int to = width(want);
    if (from > 0 && to > 0) {
      return from < to && (from < 10) == (to < 10);
    }
    return false;
  }

  /** Integer widths (1..8 bytes) and float widths (14, 18): what widens into what. */
  private static int width(DataType t) {
    if (t instanceof ByteType) {
      return 1;
    }
    if (t instanceof ShortType) {
      return 2;
    }
    if (t instanceof IntegerType) {
      return 4;
    }
    if (t instanceof LongType) {
      return 8;
    }
    if (t instanceof FloatType) {
      return 14;
    }
    if (t instanceof DoubleType) {
      return 18;
    }
    return 0;
  }

  /**
   * The Arrow type PySpark gives a Spark type ({@code to_arrow_schema(schema, "UTC")}), named
   * as pyarrow prints it: the words of the Python writer's refusals.
   */
  static String arrowName(DataType t, String column) {
    if (t instanceof BooleanType) {
      return "bool";
    }
    if (t instanceof ByteType) {
      return "int8";
    }
    if (t instanceof ShortType) {
      return "int16";
    }
    if (t instanceof IntegerType) {
      return "int32";
    }
    if (t instanceof LongType) {
      return "int64";
    }
    if (t instanceof FloatType) {
      return "float";
    }
    if (t instanceof DoubleType) {
      return "double";
    }
    if (t instanceof StringType) {
      return "string";
    }
    if (t instanceof BinaryType) {
      return "binary";
    }
    if (t instanceof DateType) {
      return "date32[day]";
    }
    if (t instanceof TimestampType) {
      return "timestamp[us, tz=UTC]";
    }
    if (t instanceof TimestampNTZType) {
      return "timestamp[us]";
    }
    if (t instanceof TimeType) {
      return "time64[ns]";
    }
    if (t instanceof NullType) {
      return "null";
    }
    if (t instanceof DecimalType) {
      DecimalType d = (DecimalType) t;
      return "decimal128(" + d.precision() + ", " + d.scale() + ")";
    }
    if (t instanceof ArrayType) {
      ArrayType a = (ArrayType) t;
      return "list<element: " + arrowName(a.elementType(), column)
          + (a.containsNull() ? "" : " not null") + ">";
    }
    if (t instanceof MapType) {
      MapType m = (MapType) t;
      return "map<" + arrowName(m.keyType(), column) + ", " + arrowName(m.valueType(), column)
          + (m.valueContainsNull() ? "" : " not null") + ">";
    }
    if (t instanceof StructType) {
      List<String> parts = new ArrayList<>();
      for (StructField f : ((StructType) t).fields()) {
        parts.add(
            f.name() + ": " + arrowName(f.dataType(), column) + (f.nullable() ? "" : " not null"));
      }
      return "struct<" + String.join(", ", parts) + ">";
    }
    throw new TidegateException(
        "tidegate: column '" + column + "' is of Spark type " + t.simpleString()
            + ", which a stream-table cannot store; give it one of the table's column types");
  }
}
