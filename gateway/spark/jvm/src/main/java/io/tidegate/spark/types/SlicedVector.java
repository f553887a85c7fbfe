package io.tidegate.spark.types;

import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Rows {@code [from, from + n)} of another column vector, with no copy: how a batch of a data
 * file that straddles a partition's earliest offset drops the rows below it (a file is sorted
 * by offset, so they are a prefix) and stays columnar. Closing it leaves the vector it reads.
 */
public final class SlicedVector extends ColumnVector {
  private final ColumnVector inner;
  private final int from;

  public SlicedVector(ColumnVector inner, int from) {
    super(inner.dataType());
    this.inner = inner;
    this.from = from;
  }

  @Override
  public void close() {}

  @Override
  public boolean hasNull() {
    return inner.hasNull();
  }

  @Override
  public int numNulls() {
    return inner.numNulls();
  }

  @Override
  public boolean isNullAt(int rowId) {
    return inner.isNullAt(from + rowId);
  }

  @Override
  public boolean getBoolean(int rowId) {
    return inner.getBoolean(from + rowId);
  }

  @Override
  public byte getByte(int rowId) {
    return inner.getByte(from + rowId);
  }

  @Override
  public short getShort(int rowId) {
    return inner.getShort(from + rowId);
  }

  @Override
  public int getInt(int rowId) {
    return inner.getInt(from + rowId);
  }

  @Override
  public long getLong(int rowId) {
    return inner.getLong(from + rowId);
  }

  @Override
  public float getFloat(int rowId) {
    return inner.getFloat(from + rowId);
  }

  @Override
  public double getDouble(int rowId) {
    return inner.getDouble(from + rowId);
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    return inner.getArray(from + rowId);
  }

  @Override
  public ColumnarMap getMap(int ordinal) {
    return inner.getMap(from + ordinal);
  }

  @Override
  public Decimal getDecimal(int rowId, int precision, int scale) {
    return inner.getDecimal(from + rowId, precision, scale);
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    return inner.getUTF8String(from + rowId);
  }

  @Override
  public byte[] getBinary(int rowId) {
    return inner.getBinary(from + rowId);
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    return new SlicedVector(inner.getChild(ordinal), from);
  }
}
