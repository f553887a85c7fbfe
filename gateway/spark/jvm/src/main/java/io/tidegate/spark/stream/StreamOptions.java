package io.tidegate.spark.stream;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import java.io.IOException;
import java.util.Arrays;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;

/**
 * The options of streaming reads, read as the Python source reads them ({@code
 * Options.starting_offsets}, {@code reconnect_timeout} and {@code maxRecordsPerTrigger} in
 * {@code gateway/spark/_options.py}), with the same refusals.
 */
final class StreamOptions {
  /** {@code startingOffsets}' "earliest" for a partition (Kafka's -2). */
  static final long EARLIEST = -2;
  /** {@code startingOffsets}' "latest" for a partition (Kafka's -1). */
  static final long LATEST = -1;

  private StreamOptions() {}

  /**
   * {@code startingOffsets}: per partition of {@code partitions} an offset, {@link #EARLIEST}
   * or {@link #LATEST}. Accepts {@code earliest} (default), {@code latest} or JSON such as
   * {@code {"0": 42, "1": -2}}; partitions not named start at the earliest offset.
   */
  static Map<Integer, Long> startingOffsets(ReadOptions options, int[] partitions) {
    String given = options.get("startingOffsets");
    String text = given == null ? "earliest" : given.strip();
    Map<Integer, Long> out = new TreeMap<>();
    String lower = text.toLowerCase(Locale.ROOT);
    if (lower.equals("earliest") || lower.equals("latest")) {
      for (int p : partitions) {
        out.put(p, lower.equals("earliest") ? EARLIEST : LATEST);
      }
      return out;
    }
    JsonNode raw;
    try {
      raw = Gateway.JSON.readTree(text);
    } catch (IOException e) {
      raw = null;
    }
    if (raw == null || !raw.isObject()) {
      throw new TidegateException(
          "tidegate: option 'startingOffsets' is '" + text + "'; give 'earliest', 'latest' or "
              + "JSON such as {\"0\": 42, \"1\": -2}");
    }
    for (int p : partitions) {
      out.put(p, EARLIEST);
    }
    for (Map.Entry<String, JsonNode> e : raw.properties()) {
      String key = e.getKey();
      int p = key.matches("\\d{1,9}") ? Integer.parseInt(key) : -1;
      if (!out.containsKey(p)) {
        throw new TidegateException(
            "tidegate: option 'startingOffsets' names partition '" + key + "'; the read covers "
                + "partitions " + Arrays.toString(partitions));
      }
      JsonNode v = e.getValue();
      if (!v.isIntegralNumber() || !v.canConvertToLong() || v.asLong() < -2) {
        String shown = v.isTextual() ? "'" + v.asText() + "'" : v.toString();
        throw new TidegateException(
            "tidegate: option 'startingOffsets' gives partition " + key + " the offset " + shown
                + "; give an offset >= 0, -2 (earliest) or -1 (latest)");
      }
      out.put(p, v.asLong());
    }
    return out;
  }

  /** {@code maxRecordsPerTrigger}: records a micro-batch reads at most (0: no bound). */
  static long maxRecordsPerTrigger(ReadOptions options) {
    return options.longValue("maxRecordsPerTrigger", 0, 0);
  }

  /**
   * {@code reconnectTimeout}: seconds a streaming query keeps reconnecting to a gateway that
   * went away before it fails; unset: for ever (negative), as a Kafka consumer does.
   */
  static double reconnectTimeout(ReadOptions options) {
    String text = options.get("reconnectTimeout");
    if (text == null) {
      return -1;
    }
    double value;
    try {
      value = Double.parseDouble(text.strip());
    } catch (NumberFormatException e) {
      value = -1;
    }
    if (!(value > 0) || Double.isInfinite(value)) {
      throw new TidegateException(
          "tidegate: option 'reconnectTimeout' is '" + text + "'; give a number of seconds > 0, "
              + "or leave it out to reconnect for ever");
    }
    return value;
  }
}
