import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
// Reads hex strings, one per line; prints hex of new String(bytes, UTF_8).getBytes(UTF_8).
public class JavaUTF8 {
  public static void main(String[] a) throws Exception {
    BufferedReader r = new BufferedReader(new InputStreamReader(System.in));
    HexFormat h = HexFormat.of();
    for (String line; (line = r.readLine()) != null;) {
      byte[] b = h.parseHex(line.trim());
      System.out.println(line.trim() + " " + h.formatHex(new String(b, StandardCharsets.UTF_8).getBytes(StandardCharsets.UTF_8)));
    }
  }
}
