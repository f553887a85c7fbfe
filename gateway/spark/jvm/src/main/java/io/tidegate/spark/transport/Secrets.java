package io.tidegate.spark.transport;

import org.apache.spark.sql.internal.SQLConf;

/**
 * Keeps the tenant's key out of what Spark prints. Spark prints a write's options with its
 * plan ({@code AppendData ..., [endpoint=..., api_key=...]} in an extended explain, the SQL
 * tab of its UI with {@code spark.sql.ui.explainMode=extended}, and errors that quote a plan),
 * redacting only the options whose name or value matches {@code spark.redaction.regex}
 * ({@code secret|password|token|access.key}) or the session's {@code
 * spark.sql.redaction.options.regex} ({@code url}); {@code api_key} matches neither. So the
 * session that uses the connector gets {@code api_key} added to the latter, once.
 */
public final class Secrets {
  static final String OPTIONS_REGEX = "spark.sql.redaction.options.regex";
  /** The option names whose values Spark must not print. */
  static final String API_KEY = "(?i)^api_key$";

  private Secrets() {}

  /** Adds {@code api_key} to the active session's redacted options (if not there yet). */
  public static void redactApiKey() {
    SQLConf conf = SQLConf.get();
    String current = conf.getConfString(OPTIONS_REGEX, "(?i)url");
    if (!current.contains(API_KEY)) {
      conf.setConfString(
          OPTIONS_REGEX, current.isEmpty() ? API_KEY : "(?:" + current + ")|" + API_KEY);
    }
  }
}
