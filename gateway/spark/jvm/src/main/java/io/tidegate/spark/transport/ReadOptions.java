package io.tidegate.spark.transport;

import io.tidegate.spark.types.TidegateException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * The options of {@code format("tidegate")}, checked once on the driver: the same names and
 * the same refusals as the Python source's ({@code gateway/spark/_options.py}).
 */
public final class ReadOptions implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Every option either implementation takes (lower case), Spark's own included. */
  static final Set<String> ACCEPTED =
      Set.of(
          "endpoint", "api_key", "table", "path", "warehouse",
          "as_of", "partitions", "columns", "split_bytes", "min_partitions", "hot_split_records",
          "startingoffsets", "maxrecordspertrigger", "reconnecttimeout",
          "write_id", "batch_rows", "batch_bytes", "test_fail_after_batches",
          "checkpointlocation");

  private final TreeMap<String, String> values = new TreeMap<>();

  public ReadOptions(Map<String, String> options) {
    for (Map.Entry<String, String> e : options.entrySet()) {
      values.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
    }
    TreeSet<String> unknown = new TreeSet<>(values.keySet());
    unknown.removeAll(ACCEPTED);
    if (!unknown.isEmpty()) {
      TreeSet<String> accepted = new TreeSet<>(ACCEPTED);
      accepted.remove("path");
      accepted.remove("checkpointlocation");
      throw new TidegateException(
          "tidegate: unknown option(s) " + pyList(unknown) + "; accepted: " + pyList(accepted));
    }
  }

  /** A Python list's text, as the Python source words the same refusals. */
  public static String pyList(Iterable<String> items) {
    StringBuilder out = new StringBuilder("[");
    for (String s : items) {
      if (out.length() > 1) {
        out.append(", ");
      }
      out.append('\'').append(s).append('\'');
    }
    return out.append(']').toString();
  }

  public String get(String name) {
    String v = values.get(name.toLowerCase(Locale.ROOT));
    return v == null || v.isEmpty() ? null : v;
  }

  public Map<String, String> asMap() {
    return values;
  }

  public int integer(String name, int fallback, int minimum) {
    long v = longValue(name, fallback, minimum);
    if (v > Integer.MAX_VALUE) {
      throw new TidegateException(
          "tidegate: option '" + name + "' is '" + get(name) + "'; give an integer >= "
              + minimum + " and <= " + Integer.MAX_VALUE);
    }
    return (int) v;
  }

  public long longValue(String name, long fallback, long minimum) {
    String text = get(name);
    if (text == null) {
      return fallback;
    }
    long value;
    try {
      value = Long.parseLong(text.trim());
    } catch (NumberFormatException e) {
      value = minimum - 1;
    }
    if (value < minimum) {
      throw new TidegateException(
          "tidegate: option '" + name + "' is '" + text + "'; give an integer >= " + minimum);
    }
    return value;
  }

  /** A comma-separated list option (empty when not given). */
  public List<String> names(String name) {
    String text = get(name);
    List<String> out = new ArrayList<>();
    if (text != null) {
      for (String part : text.split(",")) {
        if (!part.isBlank()) {
          out.add(part.strip());
        }
      }
    }
    return out;
  }

  /** The gateway's HTTP address, without a trailing slash. */
  public String endpoint() {
    String endpoint = get("endpoint");
    if (endpoint == null) {
      throw new TidegateException(
          "tidegate: option 'endpoint' is missing; give the gateway's HTTP address, "
              + "e.g. .option('endpoint', 'http://gateway:8080')");
    }
    String lower = endpoint.toLowerCase(Locale.ROOT);
    if (!lower.startsWith("http://") && !lower.startsWith("https://")) {
      throw new TidegateException(
          "tidegate: option 'endpoint' is '" + endpoint + "'; the JVM connector talks to the "
              + "gateway's HTTP edge: give its HTTP address, e.g. 'http://gateway:8080'");
    }
    return endpoint.replaceAll("/+$", "");
  }

  public String apiKey() {
    String key = get("api_key");
    if (key == null) {
      key = System.getenv("TIDEGATE_API_KEY");
    }
    return key == null || key.isEmpty() ? null : key;
  }

  /** The table as {namespace, name}. */
  public String[] table() {
    String table = get("table");
    if (table == null) {
      table = get("path");
    }
    if (table == null) {
      throw new TidegateException(
          "tidegate: no table given; name it as .load('namespace.table') "
              + "or .option('table', 'namespace.table')");
    }
    String[] parts = table.split("\\.", -1);
    if (parts.length != 2 || parts[0].isEmpty() || parts[1].isEmpty()) {
      throw new TidegateException(
          "tidegate: table '" + table + "' is not of the form 'namespace.table'");
    }
    return parts;
  }

  public String tableName() {
    return String.join(".", table());
  }

  /** The {@code partitions} option checked against the table's {@code count} (null: all). */
  public int[] partitions(int count) {
    List<String> chosen = names("partitions");
    if (chosen.isEmpty()) {
      return null;
    }
    TreeSet<Integer> out = new TreeSet<>();
    for (String text : chosen) {
      int p;
      try {
        p = Integer.parseInt(text);
      } catch (NumberFormatException e) {
        p = -1;
      }
      if (p < 0 || p >= count) {
        throw new TidegateException(
            "tidegate: option 'partitions' names partition '" + text + "'; the table has "
                + "partitions 0.." + (count - 1));
      }
      out.add(p);
    }
    return out.stream().mapToInt(Integer::intValue).toArray();
  }

  /** The {@code columns} option checked against the table's columns (all when absent). */
  public List<String> columns(List<String> available) {
    List<String> chosen = names("columns");
    List<String> unknown = new ArrayList<>();
    for (String c : chosen) {
      if (!available.contains(c)) {
        unknown.add(c);
      }
    }
    if (!unknown.isEmpty()) {
      throw new TidegateException(
          "tidegate: option 'columns' names unknown column(s) " + pyList(unknown)
              + "; the table has " + pyList(available));
    }
    return chosen.isEmpty() ? available : chosen;
  }

  @Override
  public String toString() {
    return "ReadOptions" + Arrays.toString(values.keySet().toArray());
  }
}
