package io.tidegate.spark.write;

import io.tidegate.spark.transport.ReadOptions;
import io.tidegate.spark.types.TidegateException;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;

/**
 * {@code df.write.format("tidegate").mode("append")} and {@code writeStream.format("tidegate")}
 * in append output mode. Truncation ({@code mode("overwrite")}, the complete output mode) is
 * refused with the Python writer's sentence: a stream-table only grows.
 */
public final class TidegateWriteBuilder implements WriteBuilder, SupportsTruncate {
  private final LogicalWriteInfo info;

  public TidegateWriteBuilder(LogicalWriteInfo info) {
    this.info = info;
  }

  @Override
  public WriteBuilder truncate() {
    throw new TidegateException(
        "tidegate: save mode 'overwrite' is not supported: a stream-table only grows; "
            + "use mode('append')");
  }

  /** The table described and the DataFrame's schema checked against it, on the driver. */
  @Override
  public Write build() {
    return new TidegateWrite(WriteTarget.of(new ReadOptions(info.options()), info.schema()), info);
  }
}
