package io.tidegate.spark.read;

import io.tidegate.spark.types.Types;
import java.io.Serializable;
import java.math.BigDecimal;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;

/**
 * Spark's pushed predicates in Tidegate's filter language ({@code gateway.wire.filters}), with
 * the translation rules of the Python source ({@code gateway/spark/_pushdown.py}): comparisons,
 * IN, IS [NOT] NULL, NOT and STARTS_WITH on top-level columns of numbers (not floating point:
 * Spark orders NaN above every number), strings, booleans, dates, timestamps and decimals.
 *
 * <p>The translated conjunction prunes the plan's files (by partition values and column
 * statistics) and hot ranges (by {@code _partition} and {@code _offset}); Spark still evaluates
 * every predicate on the rows read, so the answer has Spark's own SQL semantics.
 */
public final class Filters {
  private Filters() {}

  /** The translated predicates' text, conjoined (null when none translates). */
  static String text(Predicate[] predicates, StructType schema) {
    List<String> parts = new ArrayList<>();
    for (Predicate p : predicates) {
      String t = node(p, schema);
      if (t != null) {
        parts.add(t);
      }
    }
    if (parts.isEmpty()) {
      return null;
    }
    if (parts.size() == 1) {
      return parts.get(0);
    }
    StringBuilder out = new StringBuilder();
    for (String part : parts) {
      if (out.length() > 0) {
        out.append(" and ");
      }
      out.append('(').append(part).append(')');
    }
    return out.toString();
  }

  private static String flip(String op) {
    switch (op) {
      case "<":
        return ">";
      case "<=":
        return ">=";
      case ">":
        return "<";
      case ">=":
        return "<=";
      default:
        return op;
    }
  }

  /** The filter text of one predicate, or null when it stays with Spark alone. */
  static String node(Predicate p, StructType schema) {
    String op = p.name();
    Expression[] c = p.children();
    switch (op) {
      case "=":
      case "<":
      case "<=":
      case ">":
      case ">=":
        {
          if (c.length != 2) {
            return null;
          }
          String column = column(c[0], schema);
          Literal<?> lit = c[1] instanceof Literal ? (Literal<?>) c[1] : null;
          if (column == null && c[1] instanceof NamedReference && c[0] instanceof Literal) {
            column = column(c[1], schema);
            lit = (Literal<?>) c[0];
            op = flip(op);
          }
          if (column == null || lit == null) {
            return null;
          }
          String value = literal(lit, schema.apply(column).dataType());
          return value == null ? null : quote(column) + " " + op + " " + value;
        }
      case "IN":
        {
          if (c.length < 2) {
            return null;
          }
          String column = column(c[0], schema);
          if (column == null) {
            return null;
          }
          DataType type = schema.apply(column).dataType();
          List<String> values = new ArrayList<>();
          for (int i = 1; i < c.length; i++) {
            if (!(c[i] instanceof Literal)) {
              return null;
            }
            String v = literal((Literal<?>) c[i], type);
            if (v == null) {
              return null;
            }
            values.add(v);
          }
          return quote(column) + " in (" + String.join(", ", values) + ")";
        }
      case "IS_NULL":
      case "IS_NOT_NULL":
        {
          if (c.length != 1 || !(c[0] instanceof NamedReference)) {
            return null;
          }
          String[] names = ((NamedReference) c[0]).fieldNames();
          if (names.length != 1 || !has(schema, names[0])) {
            return null;
          }
          return quote(names[0]) + (op.equals("IS_NULL") ? " is null" : " is not null");
        }
      case "NOT":
        {
          if (c.length != 1 || !(c[0] instanceof Predicate)) {
            return null;
          }
          String inner = node((Predicate) c[0], schema);
          return inner == null ? null : "not (" + inner + ")";
        }
      case "STARTS_WITH":
        {
          if (c.length != 2 || !(c[1] instanceof Literal)) {
            return null;
          }
          String column = column(c[0], schema);
          if (column == null || !(schema.apply(column).dataType() instanceof StringType)) {
            return null;
          }
          Object v = ((Literal<?>) c[1]).value();
          if (v == null) {
            return null;
          }
          String prefix = v.toString();
          if (prefix.contains("%") || prefix.contains("_") || prefix.contains("\\")) {
            return null;
          }
          return quote(column) + " like " + string(prefix + "%");
        }
      default:
        return null;
    }
  }

  private static boolean has(StructType schema, String name) {
    for (String n : schema.fieldNames()) {
      if (n.equals(name)) {
        return true;
      }
    }
    return false;
  }

  /** A comparable top-level column of the schema, or null. */
  private static String column(Expression e, StructType schema) {
    if (!(e instanceof NamedReference)) {
      return null;
    }
    String[] names = ((NamedReference) e).fieldNames();
    if (names.length != 1 || !has(schema, names[0])) {
      return null;
    }
    DataType t = schema.apply(names[0]).dataType();
    boolean comparable =
        t instanceof ByteType
            || t instanceof ShortType
            || t instanceof IntegerType
            || t instanceof LongType
            || t instanceof StringType
            || t instanceof BooleanType
            || t instanceof DateType
            || t instanceof TimestampType
            || t instanceof TimestampNTZType
            || t instanceof DecimalType;
    return comparable ? names[0] : null;
  }

  public static String quote(String name) {
    return '"' + name.replace("\"", "\"\"") + '"';
  }

  static String string(String s) {
    return "'" + s.replace("'", "''") + "'";
  }

  /** A literal's filter text for a column of {@code type}, or null when not pushed. */
  static String literal(Literal<?> lit, DataType type) {
    Object v = lit.value();
    DataType lt = lit.dataType();
    if (v == null || !lt.sameType(type)) {
      return null;
    }
    if (type instanceof ByteType
        || type instanceof ShortType
        || type instanceof IntegerType
        || type instanceof LongType) {
      return v.toString();
    }
    if (type instanceof BooleanType) {
      return ((Boolean) v) ? "true" : "false";
    }
    if (type instanceof StringType) {
      return string(v.toString());
    }
    if (type instanceof DecimalType) {
      BigDecimal d = v instanceof Decimal ? ((Decimal) v).toJavaBigDecimal() : new BigDecimal(v.toString());
      return d.toPlainString();
    }
    if (type instanceof DateType) {
      return string(LocalDate.ofEpochDay(((Number) v).longValue()).toString());
    }
    if (type instanceof TimestampType) {
      long micros = ((Number) v).longValue();
      Instant at = Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L), Math.floorMod(micros, 1_000_000L) * 1000L);
      return string(LocalDateTime.ofInstant(at, ZoneOffset.UTC) + "+00:00");
    }
    if (type instanceof TimestampNTZType) {
      long micros = ((Number) v).longValue();
      Instant at = Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L), Math.floorMod(micros, 1_000_000L) * 1000L);
      return string(LocalDateTime.ofInstant(at, ZoneOffset.UTC).toString());
    }
    return null;
  }

  /**
   * What the conjunction of {@code predicates} says of {@code _partition} and {@code _offset}
   * (a superset of the rows it keeps): the partitions it may keep (null: any) and the offsets
   * {@code [low, high)} (high -1: unbounded).
   */
  public static final class Bounds implements Serializable {
    private static final long serialVersionUID = 1L;

    public static final Bounds ALL = new Bounds(null, 0, -1);

    final Set<Integer> partitions;
    final long low;
    final long high;

    Bounds(Set<Integer> partitions, long low, long high) {
      this.partitions = partitions;
      this.low = low;
      this.high = high;
    }

    boolean keeps(int partition) {
      return partitions == null || partitions.contains(partition);
    }

    Bounds withPartitions(int[] chosen) {
      if (chosen == null) {
        return this;
      }
      Set<Integer> keep = new TreeSet<>();
      for (int p : chosen) {
        if (keeps(p)) {
          keep.add(p);
        }
      }
      return new Bounds(keep, low, high);
    }
  }

  static Bounds bounds(Predicate[] predicates) {
    Set<Integer> parts = null;
    long low = 0;
    long high = -1;
    for (Predicate p : predicates) {
      if (p.name().equals("ALWAYS_FALSE")) {
        return new Bounds(new TreeSet<>(), 0, -1);
      }
      Expression[] c = p.children();
      String op = p.name();
      if (op.equals("IN") && c.length >= 2 && isColumn(c[0], Types.PARTITION)) {
        Set<Integer> keep = new TreeSet<>();
        for (int i = 1; i < c.length; i++) {
          if (!(c[i] instanceof Literal) || ((Literal<?>) c[i]).value() == null) {
            keep = null;
            break;
          }
          keep.add(((Number) ((Literal<?>) c[i]).value()).intValue());
        }
        if (keep != null) {
          parts = intersect(parts, keep);
        }
        continue;
      }
      if (c.length != 2 || !Set.of("=", "<", "<=", ">", ">=").contains(op)) {
        continue;
      }
      Expression col = c[0];
      Expression lit = c[1];
      if (c[0] instanceof Literal && c[1] instanceof NamedReference) {
        col = c[1];
        lit = c[0];
        op = flip(op);
      }
      if (!(lit instanceof Literal) || !(((Literal<?>) lit).value() instanceof Number)) {
        continue;
      }
      long v = ((Number) ((Literal<?>) lit).value()).longValue();
      long lo = 0;
      long hi = -1;
      switch (op) {
        case "=":
          lo = v;
          hi = v + 1;
          break;
        case ">":
          lo = v + 1;
          break;
        case ">=":
          lo = v;
          break;
        case "<":
          hi = Math.max(0, v);
          break;
        default: // "<="
          hi = Math.max(0, v + 1);
          break;
      }
      if (isColumn(col, Types.OFFSET)) {
        low = Math.max(low, lo);
        if (hi >= 0) {
          high = high < 0 ? hi : Math.min(high, hi);
        }
      } else if (isColumn(col, Types.PARTITION) && hi >= 0 && hi - Math.max(lo, 0) <= 1_000_000) {
        Set<Integer> keep = new TreeSet<>();
        for (long q = Math.max(lo, 0); q < hi; q++) {
          keep.add((int) q);
        }
        parts = intersect(parts, keep);
      }
    }
    return new Bounds(parts, low, high);
  }

  private static Set<Integer> intersect(Set<Integer> a, Set<Integer> b) {
    if (a == null) {
      return b;
    }
    Set<Integer> out = new TreeSet<>(a);
    out.retainAll(b);
    return out;
  }

  private static boolean isColumn(Expression e, String name) {
    return e instanceof NamedReference
        && ((NamedReference) e).fieldNames().length == 1
        && ((NamedReference) e).fieldNames()[0].equals(name);
  }
}
