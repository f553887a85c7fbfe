package io.tidegate.spark.types;

/**
 * A refusal of the connector: one sentence naming the option, value, table or file and what
 * would be accepted. Spark shows its message as is (PySpark as an IllegalArgumentException).
 */
public final class TidegateException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  /** The gateway's machine-readable reason (e.g. TABLE_NOT_FOUND), or null. */
  private final String reason;

  public TidegateException(String message) {
    this(message, null);
  }

  public TidegateException(String message, String reason) {
    super(message);
    this.reason = reason;
  }

  public String reason() {
    return reason;
  }
}
