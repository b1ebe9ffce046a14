package io.reconciler.example;

import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

/** Item digests of scheme sdk-sha256-v1, written from schemas/SPEC.md section 3. */
public final class CanonicalJson {
  private static final Set<String> INTERNAL_KEYS =
      Set.of("_agents_tool_description", "_agents_tool_title", "created_by");

  private CanonicalJson() {}

  /** The canonical text of one item (a JSON object). */
  public static String canonical(JsonNode item, boolean ignoreIds) {
    if (!item.isObject()) {
      throw new IllegalArgumentException("a Session item must be a JSON object");
    }
    StringBuilder out = new StringBuilder();
    writeObject(item, out, true, ignoreIds);
    return out.toString();
  }

  /** SHA-256 hex (64 lower-case characters) of the canonical text. */
  public static String digest(JsonNode item, boolean ignoreIds) {
    try {
      MessageDigest sha = MessageDigest.getInstance("SHA-256");
      byte[] hash = sha.digest(canonical(item, ignoreIds).getBytes(StandardCharsets.UTF_8));
      return HexFormat.of().formatHex(hash);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every JVM has SHA-256", e);
    }
  }

  private static void write(JsonNode node, StringBuilder out) {
    if (node.isObject()) {
      writeObject(node, out, false, false);
    } else if (node.isArray()) {
      out.append('[');
      for (int i = 0; i < node.size(); i++) {
        if (i > 0) {
          out.append(", ");
        }
        write(node.get(i), out);
      }
      out.append(']');
    } else if (node.isTextual()) {
      writeString(node.textValue(), out);
    } else if (node.isBoolean()) {
      out.append(node.booleanValue() ? "true" : "false");
    } else if (node.isNull()) {
      out.append("null");
    } else if (node.isIntegralNumber()) {
      out.append(node.bigIntegerValue().toString());
    } else if (node.isFloatingPointNumber()) {
      out.append(pythonRepr(node.doubleValue()));
    } else {
      throw new IllegalArgumentException("not a JSON value: " + node.getNodeType());
    }
  }

  private static void writeObject(JsonNode node, StringBuilder out, boolean top, boolean ignoreIds) {
    List<String> keys = new ArrayList<>();
    for (Iterator<String> it = node.fieldNames(); it.hasNext(); ) {
      String key = it.next();
      if (top && (INTERNAL_KEYS.contains(key) || (ignoreIds && key.equals("id")))) {
        continue;
      }
      keys.add(key);
    }
    keys.sort(CanonicalJson::compareCodePoints);
    out.append('{');
    for (int i = 0; i < keys.size(); i++) {
      if (i > 0) {
        out.append(", ");
      }
      writeString(keys.get(i), out);
      out.append(": ");
      write(node.get(keys.get(i)), out);
    }
    out.append('}');
  }

  /** Code point order, as Python sorts strings (String.compareTo compares UTF-16 units). */
  static int compareCodePoints(String a, String b) {
    int[] x = a.codePoints().toArray();
    int[] y = b.codePoints().toArray();
    for (int i = 0; i < Math.min(x.length, y.length); i++) {
      if (x[i] != y[i]) {
        return Integer.compare(x[i], y[i]);
      }
    }
    return Integer.compare(x.length, y.length);
  }

  private static void writeString(String text, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\t' -> out.append("\\t");
        case '\n' -> out.append("\\n");
        case '\f' -> out.append("\\f");
        case '\r' -> out.append("\\r");
        default -> {
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /** Python's repr of a double: the shortest digits that read back, in its notation rules. */
  static String pythonRepr(double value) {
    if (Double.isNaN(value) || Double.isInfinite(value)) {
      throw new IllegalArgumentException("NaN and infinities are not JSON");
    }
    if (value == 0.0) {
      return (1.0 / value < 0) ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(value);
    BigDecimal shortest = exact;
    for (int precision = 1; precision <= 17; precision++) {
      BigDecimal rounded = exact.round(new MathContext(precision, RoundingMode.HALF_EVEN));
      if (rounded.doubleValue() == value) {
        shortest = rounded;
        break;
      }
    }
    shortest = shortest.stripTrailingZeros();
    String digits = shortest.unscaledValue().abs().toString();
    int exponent = digits.length() - 1 - shortest.scale();
    String sign = value < 0 ? "-" : "";
    if (exponent < -4 || exponent >= 16) {
      String mantissa = digits.length() > 1 ? digits.charAt(0) + "." + digits.substring(1) : digits;
      int magnitude = Math.abs(exponent);
      return sign + mantissa + "e" + (exponent < 0 ? "-" : "+") + (magnitude < 10 ? "0" : "")
          + magnitude;
    }
    if (exponent < 0) {
      return sign + "0." + "0".repeat(-exponent - 1) + digits;
    }
    if (digits.length() <= exponent + 1) {
      return sign + digits + "0".repeat(exponent + 1 - digits.length()) + ".0";
    }
    return sign + digits.substring(0, exponent + 1) + "." + digits.substring(exponent + 1);
  }

  /** The item's type, "message" when it has none (an easy input message). */
  public static String itemType(JsonNode item) {
    JsonNode type = item.get("type");
    return type == null || type.isNull() ? "message" : type.asText();
  }

  /** The call/output pairing key, or null (SPEC.md section 3, item facts). */
  public static String callId(JsonNode item) {
    String type = itemType(item);
    JsonNode value;
    if (type.equals("mcp_approval_request")) {
      value = item.get("id");
    } else if (type.equals("mcp_approval_response")) {
      value = item.get("approval_request_id");
    } else {
      value = item.get("call_id");
    }
    return value == null || value.isNull() ? null : value.asText();
  }
}
