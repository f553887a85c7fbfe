package io.tidegate.spark.stream;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.types.TidegateException;
import java.io.IOException;
import java.util.Collections;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A streaming read's position: per partition, the next offset to read. Its JSON is the
 * Python source's to the byte ({@code json.dumps} of {@code {"0": 42, "1": 7}}: partitions in
 * numeric order, {@code ", "} and {@code ": "} between), so a checkpoint written by either
 * implementation is read by the other, and Spark, which compares offsets by their JSON, sees
 * the same offset as the same.
 */
final class StreamOffsets extends Offset {
  /** partition → next offset, in partition order. */
  final SortedMap<Integer, Long> next;

  StreamOffsets(Map<Integer, Long> next) {
    this.next = Collections.unmodifiableSortedMap(new TreeMap<>(next));
  }

  @Override
  public String json() {
    StringBuilder out = new StringBuilder("{");
    for (Map.Entry<Integer, Long> e : next.entrySet()) {
      if (out.length() > 1) {
        out.append(", ");
      }
      out.append('"').append(e.getKey()).append("\": ").append(e.getValue());
    }
    return out.append('}').toString();
  }

  /** The offsets of a checkpoint's JSON, or one sentence saying what is wrong with it. */
  static StreamOffsets parse(String json, String table) {
    JsonNode node;
    try {
      node = Gateway.JSON.readTree(json);
    } catch (IOException e) {
      node = null;
    }
    String wanted =
        "; a tidegate stream's offsets are JSON such as {\"0\": 42, \"1\": 7} (partition → "
            + "next offset)";
    if (node == null || !node.isObject()) {
      throw new TidegateException(
          "tidegate: the checkpoint's offsets of " + table + " are '" + json + "'" + wanted);
    }
    Map<Integer, Long> out = new TreeMap<>();
    for (Map.Entry<String, JsonNode> e : node.properties()) {
      JsonNode v = e.getValue();
      int p;
      try {
        p = Integer.parseInt(e.getKey());
      } catch (NumberFormatException notNumber) {
        p = -1;
      }
      if (p < 0 || !v.isIntegralNumber() || v.asLong() < 0) {
        throw new TidegateException(
            "tidegate: the checkpoint's offsets of " + table + " give partition '" + e.getKey()
                + "' the offset " + v + wanted);
      }
      out.put(p, v.asLong());
    }
    return new StreamOffsets(out);
  }
}
