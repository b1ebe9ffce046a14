package io.reconciler.example;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/** The records of the wire contract, read from the shipped .avsc files (SPEC.md sections 2, 4). */
public final class Wire {
  final Schema intent;
  final Schema ack;
  final Schema resume;
  final Schema decision;
  private final BinaryMessageDecoder<GenericRecord> decisions;

  Wire(File schemaDir) throws IOException {
    // One parser per file: the files define shared named types (Binding, ItemFacts) each.
    // The versions with the causal context (SPEC.md section 7); older ones stay valid writers.
    intent = new Schema.Parser().parse(new File(schemaDir, "intent.v3.avsc"));
    ack = new Schema.Parser().parse(new File(schemaDir, "ack.v2.avsc"));
    resume = new Schema.Parser().parse(new File(schemaDir, "resume.v3.avsc"));
    decision = new Schema.Parser().parse(new File(schemaDir, "decision.v1.avsc"));
    // Decisions are read as v1; every shipped version is a known writer (SPEC.md section 7:
    // newer versions resolve to older readers), so a newer engine's decisions still decode.
    decisions = new BinaryMessageDecoder<>(GenericData.get(), decision);
    File[] versions = schemaDir.listFiles((dir, name) -> name.matches("decision\\.v\\d+\\.avsc"));
    for (File version : versions == null ? new File[0] : versions) {
      decisions.addSchema(new Schema.Parser().parse(version));
    }
  }

  /** Avro single-object encoding: C3 01, the 8-byte fingerprint, the body. */
  static byte[] encode(GenericRecord record) throws IOException {
    ByteBuffer buffer =
        new BinaryMessageEncoder<GenericRecord>(GenericData.get(), record.getSchema())
            .encode(record);
    byte[] bytes = new byte[buffer.remaining()];
    buffer.get(bytes);
    return bytes;
  }

  GenericRecord decodeDecision(byte[] value) throws IOException {
    return decisions.decode(value);
  }

  /** The non-null branch of a field's type (the type itself when it is not a union). */
  static Schema present(Schema schema) {
    if (schema.getType() != Schema.Type.UNION) {
      return schema;
    }
    for (Schema branch : schema.getTypes()) {
      if (branch.getType() != Schema.Type.NULL) {
        return branch;
      }
    }
    throw new IllegalArgumentException("union without a value branch: " + schema);
  }

  static Schema fieldType(Schema record, String field) {
    return present(record.getField(field).schema());
  }

  static GenericData.EnumSymbol symbol(Schema record, String field, String name) {
    return new GenericData.EnumSymbol(fieldType(record, field), name);
  }

  static GenericRecord binding(Schema record, JsonNode spec) {
    Schema schema = fieldType(record, "binding");
    GenericRecordBuilder builder =
        new GenericRecordBuilder(schema)
            .set("backend_id", spec.get("backend_id").asText())
            .set("namespace", spec.get("namespace").asText())
            .set("ignore_ids", spec.path("ignore_ids").asBoolean(false))
            .set("store_enforces_fence", spec.path("store_enforces_fence").asBoolean(false));
    return builder.build();
  }

  /** Item facts (digest, type, pairing id) of raw items, never their content. */
  static List<GenericRecord> facts(Schema itemFacts, JsonNode items, boolean ignoreIds) {
    List<GenericRecord> out = new ArrayList<>();
    for (JsonNode item : items) {
      out.add(
          new GenericRecordBuilder(itemFacts)
              .set("digest", CanonicalJson.digest(item, ignoreIds))
              .set("item_type", CanonicalJson.itemType(item))
              .set("call_id", CanonicalJson.callId(item))
              .build());
    }
    return out;
  }

  static List<String> digests(JsonNode items, boolean ignoreIds) {
    List<String> out = new ArrayList<>();
    for (JsonNode item : items) {
      out.add(CanonicalJson.digest(item, ignoreIds));
    }
    return out;
  }

  /**
   * The causal context of an event (SPEC.md section 7): {@code producer}, its {@code seq}, and
   * the events it follows, each a (producer, seq) pair.
   */
  static GenericRecord causal(Schema record, String producer, long seq, List<Object[]> after) {
    Schema context = fieldType(record, "causal");
    Schema cause = context.getField("after").schema().getElementType();
    List<GenericRecord> causes = new ArrayList<>();
    for (Object[] named : after) {
      causes.add(
          new GenericRecordBuilder(cause).set("producer", named[0]).set("seq", named[1]).build());
    }
    return new GenericRecordBuilder(context)
        .set("producer", producer)
        .set("seq", seq)
        .set("after", causes)
        .build();
  }

  static Long optionalLong(JsonNode node) {
    return node == null || node.isNull() ? null : node.asLong();
  }
}
