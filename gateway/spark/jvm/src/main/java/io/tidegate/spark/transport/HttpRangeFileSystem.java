package io.tidegate.spark.transport;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * The plan's data files over HTTP range requests (a presigned URL on object storage, a link
 * through the gateway on a local warehouse), as a read-only Hadoop file system, so Spark's own
 * vectorized Parquet reader reads them: the footer and the column chunks it needs, never the
 * whole object, and never with the warehouse's keys.
 *
 * <p>A task registers each file's URL and size (known from the plan) under a fresh name of
 * the scheme {@value #SCHEME}; the name is all Hadoop sees, so a presigned URL's query string
 * never goes through Hadoop's path handling.
 */
public final class HttpRangeFileSystem extends FileSystem {
  public static final String SCHEME = "tidegate-http";
  /** Read at least this much per request (a footer, small column chunks). */
  private static final int MIN_FETCH = 256 * 1024;

  private static final Map<String, long[]> SIZES = new ConcurrentHashMap<>();
  private static final Map<String, String> URLS = new ConcurrentHashMap<>();

  private URI uri;

  /** A Hadoop path naming {@code url} (of {@code size} bytes) for this JVM's tasks. */
  public static Path register(String url, long size) {
    String id = UUID.randomUUID().toString();
    URLS.put(id, url);
    SIZES.put(id, new long[] {size});
    return new Path(SCHEME + "://" + id + "/data.parquet");
  }

  public static void unregister(Path path) {
    String id = path.toUri().getAuthority();
    URLS.remove(id);
    SIZES.remove(id);
  }

  @Override
  public void initialize(URI name, org.apache.hadoop.conf.Configuration conf) throws IOException {
    super.initialize(name, conf);
    this.uri = URI.create(SCHEME + ":///");
  }

  @Override
  public String getScheme() {
    return SCHEME;
  }

  @Override
  public URI getUri() {
    return uri;
  }

  private static String id(Path path) throws FileNotFoundException {
    String id = path.toUri().getAuthority();
    if (id == null || !URLS.containsKey(id)) {
      throw new FileNotFoundException("tidegate: no data file registered as " + path);
    }
    return id;
  }

  @Override
  public FSDataInputStream open(Path path, int bufferSize) throws IOException {
    String id = id(path);
    return new FSDataInputStream(new RangeStream(URLS.get(id), SIZES.get(id)[0]));
  }

  @Override
  public FileStatus getFileStatus(Path path) throws IOException {
    String id = id(path);
    return new FileStatus(SIZES.get(id)[0], false, 1, 64L << 20, 0L, path);
  }

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress) throws IOException {
    throw new IOException("tidegate: data files are read-only");
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    throw new IOException("tidegate: data files are read-only");
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    throw new IOException("tidegate: data files are read-only");
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    throw new IOException("tidegate: data files are read-only");
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    return new FileStatus[] {getFileStatus(f)};
  }

  @Override
  public void setWorkingDirectory(Path dir) {}

  @Override
  public Path getWorkingDirectory() {
    return new Path(SCHEME + ":///");
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    throw new IOException("tidegate: data files are read-only");
  }

  /** A seekable stream over range requests, with one buffer of what was fetched last. */
  static final class RangeStream extends FSInputStream {
    private final String url;
    private final long size;
    private long pos;
    private byte[] buffer = new byte[0];
    private long bufferStart;

    RangeStream(String url, long size) {
      this.url = url;
      this.size = size;
    }

    @Override
    public void seek(long to) throws IOException {
      if (to < 0 || to > size) {
        throw new EOFException("tidegate: seek to " + to + " outside a file of " + size + " bytes");
      }
      pos = to;
    }

    @Override
    public long getPos() {
      return pos;
    }

    @Override
    public boolean seekToNewSource(long targetPos) {
      return false;
    }

    @Override
    public int available() {
      return (int) Math.min(Integer.MAX_VALUE, size - pos);
    }

    @Override
    public int read() throws IOException {
      byte[] one = new byte[1];
      int n = read(one, 0, 1);
      return n < 0 ? -1 : one[0] & 0xff;
    }

    @Override
    public int read(byte[] out, int off, int len) throws IOException {
      if (len == 0) {
        return 0;
      }
      if (pos >= size) {
        return -1;
      }
      len = (int) Math.min(len, size - pos);
      if (pos < bufferStart || pos + len > bufferStart + buffer.length) {
        if (len >= MIN_FETCH) {
          // A large read (a column chunk): straight into the caller's array.
          fetchInto(pos, out, off, len);
          pos += len;
          return len;
        }
        long start = pos;
        long end = Math.min(size, pos + MIN_FETCH);
        if (size - pos <= 64 * 1024) {
          // The footer is read backwards from the end: fetch the tail once.
          start = Math.max(0, size - MIN_FETCH);
          end = size;
        }
        byte[] fresh = new byte[(int) (end - start)];
        fetchInto(start, fresh, 0, fresh.length);
        buffer = fresh;
        bufferStart = start;
      }
      System.arraycopy(buffer, (int) (pos - bufferStart), out, off, len);
      pos += len;
      return len;
    }

    private void fetchInto(long start, byte[] out, int off, int len) throws IOException {
      HttpRequest req =
          HttpRequest.newBuilder(URI.create(url))
              .timeout(Duration.ofMinutes(5))
              .header("range", "bytes=" + start + "-" + (start + len - 1))
              .GET()
              .build();
      HttpResponse<InputStream> response;
      try {
        response = Gateway.client().send(req, HttpResponse.BodyHandlers.ofInputStream());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("tidegate: interrupted reading a data file", e);
      }
      try (InputStream in = response.body()) {
        int status = response.statusCode();
        if (status == 200) {
          // A server that ignores ranges: skip to the start.
          in.skipNBytes(start);
        } else if (status != 206) {
          byte[] text = in.readNBytes(500);
          throw new IOException(
              "tidegate: reading a data file of the plan answered HTTP " + status + ": "
                  + new String(text, java.nio.charset.StandardCharsets.UTF_8)
                  + " (a plan's links expire: run the query again for a fresh plan)");
        }
        int got = in.readNBytes(out, off, len);
        if (got != len) {
          throw new EOFException(
              "tidegate: a data file of the plan ended after " + (start + got) + " bytes");
        }
      }
    }
  }
}
