package io.tidegate.spark.types;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The table's schema as Spark sees it: the gateway's Arrow type names (as {@code
 * gateway.wire.schema.format_type} writes them) mapped as the Python source maps them
 * ({@code from_arrow_schema(prefer_timestamp_ntz=True)}), then the system columns.
 */
public final class Types {
  public static final String PARTITION = "_partition";
  public static final String OFFSET = "_offset";
  public static final String TIMESTAMP = "_timestamp";

  private final String text;
  private int pos;

  private Types(String text) {
    this.text = text;
  }

  /** The stored schema: the user columns of {@code fields} (JSON), then the system columns. */
  public static StructType stored(JsonNode fields) {
    List<StructField> out = new ArrayList<>();
    for (JsonNode f : fields) {
      boolean nullable = !f.has("nullable") || f.get("nullable").asBoolean(true);
      out.add(
          new StructField(
              f.get("name").asText(), parse(f.get("type").asText()), nullable, Metadata.empty()));
    }
    out.add(new StructField(PARTITION, DataTypes.IntegerType, false, Metadata.empty()));
    out.add(new StructField(OFFSET, DataTypes.LongType, false, Metadata.empty()));
    out.add(new StructField(TIMESTAMP, DataTypes.TimestampType, false, Metadata.empty()));
    return new StructType(out.toArray(new StructField[0]));
  }

  public static DataType parse(String text) {
    Types p = new Types(text);
    DataType t = p.type();
    p.skip();
    if (p.pos != text.length()) {
      throw p.fail("unexpected trailing text");
    }
    return t;
  }

  private TidegateException fail(String what) {
    return new TidegateException(
        "tidegate: cannot read the gateway's type '" + text + "': " + what + " at position "
            + pos);
  }

  private void skip() {
    while (pos < text.length() && Character.isWhitespace(text.charAt(pos))) {
      pos++;
    }
  }

  private boolean peek(String token) {
    skip();
    return text.startsWith(token, pos);
  }

  private void expect(String token) {
    if (!peek(token)) {
      throw fail("expected '" + token + "'");
    }
    pos += token.length();
  }

  private String word() {
    skip();
    int start = pos;
    while (pos < text.length()
        && (Character.isLetterOrDigit(text.charAt(pos)) || text.charAt(pos) == '_')) {
      pos++;
    }
    if (start == pos) {
      throw fail("expected a name");
    }
    return text.substring(start, pos);
  }

  private int integer() {
    String w = word();
    try {
      return Integer.parseInt(w);
    } catch (NumberFormatException e) {
      throw fail("expected a number");
    }
  }

  private DataType type() {
    String name = word();
    switch (name) {
      case "list":
        {
          expect("<");
          int save = pos;
          DataType item;
          // list<item: int32> (as pyarrow prints it) or list<int32>
          word();
          if (peek(":")) {
            expect(":");
            item = type();
            notNull();
          } else {
            pos = save;
            item = type();
          }
          expect(">");
          return DataTypes.createArrayType(item, true);
        }
      case "struct":
        {
          expect("<");
          List<StructField> fields = new ArrayList<>();
          if (!peek(">")) {
            while (true) {
              String fname = word();
              expect(":");
              DataType ftype = type();
              boolean nullable = !notNull();
              fields.add(new StructField(fname, ftype, nullable, Metadata.empty()));
              if (!peek(",")) {
                break;
              }
              expect(",");
            }
          }
          expect(">");
          return new StructType(fields.toArray(new StructField[0]));
        }
      case "decimal128":
      case "decimal":
        {
          expect("(");
          int precision = integer();
          expect(",");
          int scale = integer();
          expect(")");
          return DataTypes.createDecimalType(precision, scale);
        }
      case "timestamp":
        {
          expect("[");
          word();
          boolean zoned = false;
          if (peek(",")) {
            expect(",");
            expect("tz");
            expect("=");
            skip();
            while (pos < text.length() && text.charAt(pos) != ']') {
              pos++;
            }
            zoned = true;
          }
          expect("]");
          return zoned ? DataTypes.TimestampType : DataTypes.TimestampNTZType;
        }
      default:
        break;
    }
    if (peek("[")) {
      expect("[");
      name += "[" + word() + "]";
      expect("]");
    }
    switch (name) {
      case "bool":
      case "boolean":
        return DataTypes.BooleanType;
      case "int8":
        return DataTypes.ByteType;
      case "int16":
        return DataTypes.ShortType;
      case "int32":
        return DataTypes.IntegerType;
      case "int64":
        return DataTypes.LongType;
      case "float":
      case "float32":
        return DataTypes.FloatType;
      case "double":
      case "float64":
        return DataTypes.DoubleType;
      case "string":
      case "utf8":
        return DataTypes.StringType;
      case "binary":
        return DataTypes.BinaryType;
      case "date32":
      case "date32[day]":
        return DataTypes.DateType;
      default:
        throw new TidegateException(
            "tidegate: the JVM connector cannot read columns of type '" + name + "' yet; "
                + "read them with the Python source (gateway.spark.register(spark) without the "
                + "jar) or leave them out with option 'columns'");
    }
  }

  private boolean notNull() {
    if (peek("not null")) {
      expect("not null");
      return true;
    }
    return false;
  }
}
