package io.tidegate.spark.transport;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.tidegate.spark.types.TidegateException;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * One table of one gateway, reached over the gateway's HTTP edge with the tenant's key: the
 * describe, plan and Arrow stream-read routes. Serializable, so tasks carry it to executors
 * (the key travels as the Python source's options do; never the warehouse's keys).
 */
public final class Gateway implements Serializable {
  private static final long serialVersionUID = 1L;

  public static final String ARROW = "application/vnd.apache.arrow.stream";
  public static final ObjectMapper JSON = new ObjectMapper();
  /** One client per JVM: it pools connections for every task of the executor. */
  private static volatile HttpClient shared;

  public final String endpoint;
  final String apiKey;
  final String namespace;
  final String name;
  /**
   * The gateway's local warehouse folder as the executors see it (the {@code warehouse}
   * option), or null: a plan's files are then read there rather than through its links.
   */
  public final String warehouse;

  Gateway(String endpoint, String apiKey, String namespace, String name, String warehouse) {
    this.endpoint = endpoint;
    this.apiKey = apiKey;
    this.namespace = namespace;
    this.name = name;
    this.warehouse = warehouse;
  }

  public static Gateway of(ReadOptions options) {
    String[] table = options.table();
    return new Gateway(
        options.endpoint(), options.apiKey(), table[0], table[1], options.get("warehouse"));
  }

  public String table() {
    return namespace + "." + name;
  }

  public static HttpClient client() {
    HttpClient c = shared;
    if (c == null) {
      synchronized (Gateway.class) {
        if (shared == null) {
          shared =
              HttpClient.newBuilder()
                  .version(HttpClient.Version.HTTP_1_1)
                  .connectTimeout(Duration.ofSeconds(30))
                  .followRedirects(HttpClient.Redirect.NORMAL)
                  .build();
        }
        c = shared;
      }
    }
    return c;
  }

  public String tablePath() {
    return endpoint + "/v1/tables/" + encode(namespace) + "/" + encode(name);
  }

  public static String encode(String part) {
    return URLEncoder.encode(part, StandardCharsets.UTF_8).replace("+", "%20");
  }

  public HttpRequest.Builder request(String url) {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofMinutes(5));
    if (apiKey != null) {
      b.header("authorization", "Bearer " + apiKey);
    }
    return b;
  }

  /** The table as the gateway describes it (user schema, partitions, offsets). */
  public JsonNode describe() {
    HttpRequest req = request(tablePath()).GET().build();
    return json(send(req, "table " + table() + " at " + endpoint));
  }

  /** The read plan of one pinned view, files pruned by {@code filter} (null: none). */
  public JsonNode plan(String filter, String asOf) {
    ObjectNode body = body(filter, asOf);
    HttpRequest req =
        request(tablePath() + "/plan")
            .header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body.toString()))
            .build();
    return json(send(req, "planning a read of " + table()));
  }

  /**
   * The gateway's scan of {@code columns} of the rows {@code filter} keeps (null: all) as the
   * body of an Arrow IPC stream; the caller closes it. A primary-key table answers its current
   * state.
   */
  public HttpResponse<InputStream> scan(String[] columns, String filter, String asOf) {
    ObjectNode body = body(filter, asOf);
    com.fasterxml.jackson.databind.node.ArrayNode names = body.putArray("columns");
    for (String c : columns) {
      names.add(c);
    }
    HttpRequest req =
        request(tablePath() + "/scan")
            .header("content-type", "application/json")
            .header("accept", ARROW)
            .POST(HttpRequest.BodyPublishers.ofString(body.toString()))
            .build();
    return send(req, "scanning " + table());
  }

  private static ObjectNode body(String filter, String asOf) {
    ObjectNode body = JSON.createObjectNode();
    if (filter != null) {
      body.put("filter", filter);
    }
    if (asOf != null) {
      if (asOf.matches("-?\\d+")) {
        body.put("as_of", Long.parseLong(asOf));
      } else {
        body.put("as_of", asOf);
      }
    }
    return body;
  }

  /**
   * At most {@code maxRecords} records of {@code partition} from {@code offset}, as the body
   * of an Arrow IPC stream; the caller closes it.
   */
  public HttpResponse<InputStream> records(int partition, long offset, long maxRecords) {
    String url =
        tablePath() + "/partitions/" + partition + "/records?offset=" + offset + "&max_records="
            + maxRecords;
    HttpRequest req = request(url).header("accept", ARROW).GET().build();
    return send(req, "reading " + table() + " partition " + partition + " at offset " + offset);
  }

  private static JsonNode json(HttpResponse<InputStream> response) {
    try (InputStream in = response.body()) {
      return JSON.readTree(in);
    } catch (IOException e) {
      throw new TidegateException("tidegate: the gateway's answer is not JSON: " + e.getMessage());
    }
  }

  /** Sends {@code req}; a refusal becomes one sentence: "tidegate: what: the gateway's words". */
  static HttpResponse<InputStream> send(HttpRequest req, String what) {
    HttpResponse<InputStream> response;
    try {
      response = client().send(req, HttpResponse.BodyHandlers.ofInputStream());
    } catch (IOException e) {
      throw new TidegateException(
          "tidegate: " + what + ": cannot reach the gateway (" + e + ")", "UNAVAILABLE");
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new TidegateException("tidegate: " + what + ": interrupted", "CANCELLED");
    }
    int status = response.statusCode();
    if (status / 100 == 2) {
      return response;
    }
    String reason = "HTTP_" + status;
    String message;
    try (InputStream in = response.body()) {
      byte[] bytes = in.readAllBytes();
      String text = new String(bytes, StandardCharsets.UTF_8);
      message = text;
      try {
        JsonNode error = JSON.readTree(text).path("error");
        if (error.has("message")) {
          message = error.get("message").asText();
          reason = error.path("reason").asText(reason);
        }
      } catch (IOException notJson) {
        // the text itself says what happened
      }
    } catch (IOException e) {
      message = "HTTP " + status;
    }
    throw new TidegateException("tidegate: " + what + ": " + message, reason);
  }
}
