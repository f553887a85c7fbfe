package io.tidegate.spark.write;

import com.fasterxml.jackson.databind.JsonNode;
import io.tidegate.spark.transport.Gateway;
import io.tidegate.spark.types.TidegateException;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;

/**
 * One idempotent producer's appends to one table over the gateway's HTTP edge: an Arrow IPC
 * stream to {@code POST .../records?partition=&producer_id=&sequence=}, retried as the Python
 * SDK's {@code Retry} retries (the retryable reasons, exponential backoff from 50 ms to 2 s
 * with jitter, a {@code Retry-After} hint honoured, 120 s in all). A retry re-sends the same
 * sequence, so the gateway stores a batch once however often it arrives.
 */
final class Producer {
  /** The reasons of {@code RetryableError} and its subclasses (gateway/wire/errors.py). */
  private static final Set<String> RETRYABLE =
      Set.of(
          "UNAVAILABLE",
          "HOT_STATE_LOST",
          "RESOURCE_UNAVAILABLE",
          "THROTTLED",
          "OUT_OF_ORDER_SEQUENCE",
          "COMMIT_CONFLICT");

  private static final long RETRY_FOR_NANOS = Duration.ofSeconds(120).toNanos();

  private final Gateway gateway;
  final String producerId;

  Producer(Gateway gateway, String producerId) {
    this.gateway = gateway;
    this.producerId = producerId;
  }

  /**
   * Appends {@code body} (an Arrow IPC stream of {@code rows} rows) to {@code partition} as
   * {@code sequence}; true when the gateway had stored it already (a retried batch).
   *
   * <p>A sequence older than the gateway's de-duplication window is refused with the
   * producer's last sequence: one at or past this sequence proves this batch was stored.
   * Anything else that is not a success (an unknown producer after a hot tier lost its state,
   * a different batch under a sequence already used) fails the task in one sentence, since it
   * proves nothing about what was stored.
   */
  boolean append(int partition, long sequence, byte[] body) {
    String url =
        gateway.tablePath() + "/records?partition=" + partition + "&producer_id="
            + Gateway.encode(producerId) + "&sequence=" + sequence;
    long started = System.nanoTime();
    int failures = 0;
    while (true) {
      Answer answer = send(url, body);
      if (answer.status / 100 == 2) {
        return answer.json.path("ranges").path(0).path("duplicate").asBoolean(false);
      }
      JsonNode error = answer.json.path("error");
      boolean down = answer.status == 502 || answer.status == 503 || answer.status == 504;
      String reason = error.path("reason").asText(down ? "UNAVAILABLE" : "HTTP_" + answer.status);
      String message = error.path("message").asText(answer.text);
      if ("INVALID_IDEMPOTENT_APPEND".equals(reason) && error.has("last_sequence")) {
        if (error.get("last_sequence").asLong() >= sequence) {
          return true; // older than the window: the producer got past it, so it was stored
        }
      }
      String what = "tidegate: appending to " + gateway.table() + ": ";
      if (!RETRYABLE.contains(reason)) {
        if (reason.startsWith("INVALID_IDEMPOTENT_APPEND") || reason.startsWith("UNKNOWN_PRODUCER")) {
          message += " (this does not prove the batch was stored, so the write stops: see what "
              + "the table holds of it before writing it again)";
        }
        throw new TidegateException(what + message, reason);
      }
      failures++;
      long hint = Math.max(answer.retryAfterMillis, error.path("retry_after_ms").asLong(0));
      long delay = delayMillis(failures, hint);
      if (System.nanoTime() - started + delay * 1_000_000L > RETRY_FOR_NANOS) {
        throw new TidegateException(what + message + " (still failing after 120 s)", reason);
      }
      try {
        Thread.sleep(delay);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new TidegateException(what + "interrupted", "CANCELLED");
      }
    }
  }

  private static long delayMillis(int failures, long hint) {
    double wait = Math.min(2.0, 0.05 * Math.pow(2, Math.max(0, failures - 1)));
    wait *= 0.5 + ThreadLocalRandom.current().nextDouble() / 2;
    return Math.max((long) (wait * 1000), hint);
  }

  /** The gateway's answer to one attempt; a connection failure is a 503 of our own. */
  private Answer send(String url, byte[] body) {
    HttpRequest request =
        gateway
            .request(url)
            .header("content-type", Gateway.ARROW)
            .POST(HttpRequest.BodyPublishers.ofByteArray(body))
            .build();
    HttpResponse<InputStream> response;
    try {
      response = Gateway.client().send(request, HttpResponse.BodyHandlers.ofInputStream());
    } catch (IOException e) {
      return new Answer(503, null, "cannot reach the gateway (" + e + ")", 0);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new TidegateException(
          "tidegate: appending to " + gateway.table() + ": interrupted", "CANCELLED");
    }
    String text;
    try (InputStream in = response.body()) {
      text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      return new Answer(503, null, "the gateway's answer broke off (" + e + ")", 0);
    }
    JsonNode json = null;
    try {
      json = Gateway.JSON.readTree(text);
    } catch (IOException notJson) {
      // the text says what happened
    }
    long hint = 0;
    String retryAfter = response.headers().firstValue("retry-after").orElse(null);
    if (retryAfter != null) {
      try {
        hint = (long) (Double.parseDouble(retryAfter) * 1000);
      } catch (NumberFormatException e) {
        // an HTTP date: the backoff decides
      }
    }
    return new Answer(response.statusCode(), json, text, hint);
  }

  private static final class Answer {
    final int status;
    final JsonNode json;
    final String text;
    final long retryAfterMillis;

    Answer(int status, JsonNode json, String text, long retryAfterMillis) {
      this.status = status;
      this.json = json == null ? Gateway.JSON.createObjectNode() : json;
      this.text = text;
      this.retryAfterMillis = retryAfterMillis;
    }
  }
}
