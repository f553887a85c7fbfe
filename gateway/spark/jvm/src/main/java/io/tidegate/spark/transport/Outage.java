package io.tidegate.spark.transport;

import io.tidegate.spark.types.TidegateException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Rides a reader through a gateway outage (a restart, a rolling deploy), as the Python
 * source's {@code gateway.client._consuming.Outage} does: a call that fails for a reason worth
 * retrying waits a backoff and is tried again, for {@code timeoutSeconds} at most (negative:
 * for ever), logging one line when the outage begins and one when it ends. Any other failure
 * is thrown at once. One per driver stream or per task: it holds the outage's state.
 */
public final class Outage {
  private static final Logger LOG = LoggerFactory.getLogger(Outage.class);

  /** The gateway's reasons of its retryable errors, and this connector's for the transport. */
  static final Set<String> RETRYABLE =
      Set.of(
          "UNAVAILABLE", "THROTTLED", "COMMIT_CONFLICT", "HOT_STATE_LOST",
          "RESOURCE_UNAVAILABLE", "HTTP_502", "HTTP_503", "HTTP_504");

  private static final double BASE_SECONDS = 0.1;
  private static final double CAP_SECONDS = 2.0;

  private final String endpoint;
  private final String what;
  private final double timeoutSeconds;
  /** When the current outage began (System.nanoTime()), or -1 when the gateway answers. */
  private long since = -1;
  private int failures;

  public Outage(String endpoint, String what, double timeoutSeconds) {
    this.endpoint = endpoint;
    this.what = what;
    this.timeoutSeconds = timeoutSeconds;
  }

  static boolean retryable(TidegateException e) {
    return e.reason() != null && RETRYABLE.contains(e.reason());
  }

  /** The failure's words, without the "tidegate: " every refusal of the connector starts with. */
  private static String words(TidegateException e) {
    String m = String.valueOf(e.getMessage());
    return m.startsWith("tidegate: ") ? m.substring("tidegate: ".length()) : m;
  }

  /** {@code call()}, tried again with backoff while the gateway is away. */
  public <T> T ride(Supplier<T> call) {
    while (true) {
      try {
        T got = call.get();
        ok();
        return got;
      } catch (TidegateException e) {
        if (Thread.currentThread().isInterrupted()) {
          throw interrupted(e);
        }
        pause(e);
      }
    }
  }

  /** The gateway answered: an outage, if one was going on, is over. */
  public void ok() {
    if (since >= 0) {
      LOG.info(
          "{}: the gateway at {} answers again after {} s; resuming where it was",
          what, endpoint, String.format("%.1f", (System.nanoTime() - since) / 1e9));
      since = -1;
    }
  }

  /**
   * Waits before the next attempt after {@code e}; throws {@code e} when it is not worth
   * retrying, or an {@code UNAVAILABLE} refusal in one sentence once the timeout is spent.
   */
  public void pause(TidegateException e) {
    if (!retryable(e)) {
      throw e;
    }
    long now = System.nanoTime();
    if (since < 0) {
      since = now;
      failures = 0;
      LOG.warn(
          "{}: {}; reconnecting with backoff ({})", what, words(e),
          timeoutSeconds < 0 ? "until it answers" : "for up to " + timeoutSeconds + " s");
    }
    failures++;
    double waited = (now - since) / 1e9;
    if (timeoutSeconds >= 0 && waited >= timeoutSeconds) {
      throw new TidegateException(
          what + ": " + words(e) + " for " + Math.round(waited) + " s, longer than its "
              + "reconnect timeout of " + timeoutSeconds + " s",
          "UNAVAILABLE");
    }
    double delay = Math.min(CAP_SECONDS, BASE_SECONDS * Math.pow(2, Math.min(failures - 1, 20)));
    // Equal jitter, as the Python client's backoff: readers that lost the gateway together
    // do not all come back at once.
    delay = ThreadLocalRandom.current().nextDouble(delay / 2, delay);
    try {
      Thread.sleep(Math.max(1, (long) (delay * 1000)));
    } catch (InterruptedException stop) {
      Thread.currentThread().interrupt();
      throw interrupted(e);
    }
  }

  /**
   * What a thread interrupted mid-call throws: an interruption Spark recognizes as such (an
   * {@link InterruptedIOException}, wrapped), so a query stopped during a call or an outage
   * ends as stopped, not as failed.
   */
  private UncheckedIOException interrupted(TidegateException cause) {
    InterruptedIOException e = new InterruptedIOException(what + ": interrupted");
    e.initCause(cause);
    return new UncheckedIOException(e);
  }
}
