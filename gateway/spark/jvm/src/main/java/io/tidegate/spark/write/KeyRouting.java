package io.tidegate.spark.write;

import io.tidegate.spark.types.TidegateException;
import java.io.Serializable;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.zip.CRC32;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.catalyst.util.ArrayData;
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
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;

/**
 * The partition of a row of a keyed table, exactly as the gateway and the Python writer pick
 * it ({@code gateway/wire/routing.py}): {@code crc32(key bytes) % partitions}, where the key
 * bytes are the UTF-8 of the compact JSON array of the row's key values as Python's {@code
 * json.dumps(values, separators=(",", ":"), ensure_ascii=False, default=str)} writes the
 * values pyarrow's {@code to_pylist} gives: integers and booleans as JSON, floats as Python's
 * {@code repr}, strings escaped as {@code json} escapes them, dates, timestamps, decimals and
 * bytes as the JSON string of Python's {@code str} of them, lists as arrays and structs as
 * objects. {@code tests/spark/test_write.py} checks every key type against {@code
 * route_by_key} through Spark.
 */
final class KeyRouting implements Serializable {
  private static final long serialVersionUID = 1L;

  /** The key columns' ordinals in the written rows, and their Spark types. */
  private final int[] ordinals;

  private final DataType[] types;
  private final int partitions;

  KeyRouting(int[] ordinals, DataType[] types, int partitions) {
    this.ordinals = ordinals;
    this.types = types;
    this.partitions = partitions;
  }

  /** The table partition of {@code row}. */
  int partition(InternalRow row) {
    StringBuilder out = new StringBuilder("[");
    for (int i = 0; i < ordinals.length; i++) {
      if (i > 0) {
        out.append(',');
      }
      value(out, row, ordinals[i], types[i]);
    }
    out.append(']');
    CRC32 crc = new CRC32();
    crc.update(out.toString().getBytes(StandardCharsets.UTF_8));
    return (int) (crc.getValue() % partitions);
  }

  /** The JSON text of one value (Python's, see the class comment) appended to {@code out}. */
  static void value(StringBuilder out, SpecializedGetters from, int i, DataType type) {
    if (from.isNullAt(i)) {
      out.append("null");
    } else if (type instanceof BooleanType) {
      out.append(from.getBoolean(i) ? "true" : "false");
    } else if (type instanceof ByteType) {
      out.append(from.getByte(i));
    } else if (type instanceof ShortType) {
      out.append(from.getShort(i));
    } else if (type instanceof IntegerType) {
      out.append(from.getInt(i));
    } else if (type instanceof LongType) {
      out.append(from.getLong(i));
    } else if (type instanceof FloatType) {
      out.append(pythonRepr(from.getFloat(i)));
    } else if (type instanceof DoubleType) {
      out.append(pythonRepr(from.getDouble(i)));
    } else if (type instanceof StringType) {
      string(out, from.getUTF8String(i).toString());
    } else if (type instanceof BinaryType) {
      string(out, pythonBytes(from.getBinary(i)));
    } else if (type instanceof DateType) {
      string(out, java.time.LocalDate.ofEpochDay(from.getInt(i)).toString());
    } else if (type instanceof TimestampType) {
      string(out, pythonDateTime(from.getLong(i)) + "+00:00");
    } else if (type instanceof TimestampNTZType) {
      string(out, pythonDateTime(from.getLong(i)));
    } else if (type instanceof DecimalType) {
      DecimalType d = (DecimalType) type;
      // java.math.BigDecimal#toString and Python's str(Decimal) both follow the General
      // Decimal Arithmetic's to-scientific-string: "1.50", "0E-7", "1E-7".
      string(out, from.getDecimal(i, d.precision(), d.scale()).toJavaBigDecimal().toString());
    } else if (type instanceof ArrayType) {
      DataType item = ((ArrayType) type).elementType();
      ArrayData items = from.getArray(i);
      out.append('[');
      for (int k = 0; k < items.numElements(); k++) {
        if (k > 0) {
          out.append(',');
        }
        value(out, items, k, item);
      }
      out.append(']');
    } else if (type instanceof StructType) {
      StructField[] fields = ((StructType) type).fields();
      InternalRow struct = from.getStruct(i, fields.length);
      out.append('{');
      for (int k = 0; k < fields.length; k++) {
        if (k > 0) {
          out.append(',');
        }
        string(out, fields[k].name());
        out.append(':');
        value(out, struct, k, fields[k].dataType());
      }
      out.append('}');
    } else {
      throw new TidegateException(
          "tidegate: the JVM connector cannot route rows by a key column of type "
              + type.simpleString()
              + "; write them with the Python source (format('tidegate_python'))");
    }
  }

  /** {@code s} as Python's json writes a str with {@code ensure_ascii=False}. */
  static void string(StringBuilder out, String s) {
    out.append('"');
    for (int k = 0; k < s.length(); k++) {
      char c = s.charAt(k);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        case '\b':
          out.append("\\b");
          break;
        case '\f':
          out.append("\\f");
          break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }

  /** Python's {@code str(datetime)} of microseconds since the epoch, without an offset. */
  static String pythonDateTime(long micros) {
    long seconds = Math.floorDiv(micros, 1_000_000L);
    int fraction = (int) Math.floorMod(micros, 1_000_000L);
    LocalDateTime t = LocalDateTime.ofEpochSecond(seconds, 0, ZoneOffset.UTC);
    String text =
        String.format(
            "%04d-%02d-%02d %02d:%02d:%02d",
            t.getYear(),
            t.getMonthValue(),
            t.getDayOfMonth(),
            t.getHour(),
            t.getMinute(),
            t.getSecond());
    return fraction == 0 ? text : text + String.format(".%06d", fraction);
  }

  /** Python's {@code str(bytes)}: {@code b'...'} with its escapes. */
  static String pythonBytes(byte[] bytes) {
    boolean single = false;
    boolean dbl = false;
    for (byte b : bytes) {
      single |= b == '\'';
      dbl |= b == '"';
    }
    char quote = single && !dbl ? '"' : '\'';
    StringBuilder out = new StringBuilder("b").append(quote);
    for (byte b : bytes) {
      int c = b & 0xff;
      if (c == quote || c == '\\') {
        out.append('\\').append((char) c);
      } else if (c == '\t') {
        out.append("\\t");
      } else if (c == '\n') {
        out.append("\\n");
      } else if (c == '\r') {
        out.append("\\r");
      } else if (c < 0x20 || c >= 0x7f) {
        out.append(String.format("\\x%02x", c));
      } else {
        out.append((char) c);
      }
    }
    return out.append(quote).toString();
  }

  /**
   * Python's {@code repr(float)} (what {@code json.dumps} writes): the shortest decimal that
   * reads back as {@code v}, in fixed notation for decimal exponents -4 to 16, else as
   * {@code 1e+16}. Java 17's {@code Double.toString} is not always the shortest, so the
   * digits are found here.
   */
  static String pythonRepr(double v) {
    if (Double.isNaN(v)) {
      return "NaN";
    }
    if (Double.isInfinite(v)) {
      return v > 0 ? "Infinity" : "-Infinity";
    }
    if (v == 0) {
      return (1 / v < 0) ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(v);
    BigDecimal best = null;
    for (int digits = 1; digits <= 17 && best == null; digits++) {
      for (RoundingMode mode :
          new RoundingMode[] {RoundingMode.HALF_EVEN, RoundingMode.FLOOR, RoundingMode.CEILING}) {
        BigDecimal candidate = exact.round(new MathContext(digits, mode));
        if (candidate.doubleValue() == v
            && (best == null
                || candidate.subtract(exact).abs().compareTo(best.subtract(exact).abs()) < 0)) {
          best = candidate;
        }
      }
    }
    BigDecimal shortest = best.stripTrailingZeros();
    String digits = shortest.unscaledValue().abs().toString();
    // v = 0.DIGITS * 10^point
    int point = digits.length() - shortest.scale();
    StringBuilder out = new StringBuilder(v < 0 ? "-" : "");
    if (point <= -4 || point > 16) {
      out.append(digits.charAt(0));
      if (digits.length() > 1) {
        out.append('.').append(digits, 1, digits.length());
      }
      int exponent = point - 1;
      out.append(exponent < 0 ? "e-" : "e+");
      out.append(String.format("%02d", Math.abs(exponent)));
    } else if (point <= 0) {
      out.append("0.").append("0".repeat(-point)).append(digits);
    } else if (point >= digits.length()) {
      out.append(digits).append("0".repeat(point - digits.length())).append(".0");
    } else {
      out.append(digits, 0, point).append('.').append(digits, point, digits.length());
    }
    return out.toString();
  }
}
