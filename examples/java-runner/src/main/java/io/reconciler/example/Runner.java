package io.reconciler.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * A minimal runner written from schemas/SPEC.md: it produces intents, acks and resumes for one
 * session and reads the engine's answers.
 *
 * <pre>
 * java -cp CLASSPATH io.reconciler.example.Runner vectors schemas/digest_vectors.json
 * java -cp CLASSPATH io.reconciler.example.Runner run SCRIPT.json
 * </pre>
 *
 * <p>{@code vectors} prints one JSON line per vector with what this implementation computes.
 * {@code run} plays a script (see README.md) and prints one JSON line per awaited decision. Exit
 * status: 0 done, 2 bad arguments, 3 no answer within the script's timeout.
 */
public final class Runner {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final JsonNode script;
  private final Wire wire;
  private final String sessionId;
  private final String runnerId;
  private final String decisions;
  private final String prefix;
  private final boolean ignoreIds;
  private final KafkaProducer<byte[], byte[]> producer;
  private final KafkaConsumer<byte[], byte[]> consumer;
  private final boolean causal;
  // Causal context (SPEC.md section 7): the seq of the next event, and of the last one whose
  // delivery the brokers acknowledged (-1: none). Sends are synchronous, so that is always the
  // previous one.
  private long nextSeq = 0;
  private long acknowledgedSeq = -1;

  private Runner(JsonNode script) throws Exception {
    this.script = script;
    this.wire = new Wire(new File(script.get("schemas").asText()));
    this.sessionId = script.get("session_id").asText();
    this.runnerId = script.get("runner_id").asText();
    this.prefix = script.path("prefix").asText("reconciler.");
    this.decisions = prefix + "decisions";
    this.ignoreIds = script.get("binding").path("ignore_ids").asBoolean(false);
    this.causal = script.path("causal").asBoolean(true);
    String bootstrap = script.get("bootstrap").asText();
    Properties produce = new Properties();
    produce.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    produce.put(ProducerConfig.ACKS_CONFIG, "all");
    produce.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    // No partitioner is set: the default one places keyed records by murmur2 (SPEC.md 1).
    producer =
        new KafkaProducer<>(produce, new ByteArraySerializer(), new ByteArraySerializer());
    Properties consume = new Properties();
    consume.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    consume.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    consume.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    consume.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "20");
    consumer =
        new KafkaConsumer<>(consume, new ByteArrayDeserializer(), new ByteArrayDeserializer());
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 2 || !(args[0].equals("vectors") || args[0].equals("run"))) {
      System.err.println("usage: Runner vectors VECTORS.json | Runner run SCRIPT.json");
      System.exit(2);
    }
    JsonNode document = JSON.readTree(new File(args[1]));
    if (args[0].equals("vectors")) {
      vectors(document);
      return;
    }
    Runner runner = new Runner(document);
    try {
      System.exit(runner.play());
    } finally {
      runner.producer.close(Duration.ofSeconds(5));
      runner.consumer.close(Duration.ofSeconds(5));
    }
  }

  private static void vectors(JsonNode document) throws Exception {
    for (JsonNode vector : document.get("digests")) {
      boolean ignore = vector.get("ignore_ids").asBoolean();
      ObjectNode line = JSON.createObjectNode();
      line.put("name", vector.get("name").asText());
      line.put("canonical", CanonicalJson.canonical(vector.get("item"), ignore));
      line.put("sha256", CanonicalJson.digest(vector.get("item"), ignore));
      System.out.println(JSON.writeValueAsString(line));
    }
    for (JsonNode vector : document.get("partitions")) {
      byte[] key = vector.get("key").asText().getBytes(StandardCharsets.UTF_8);
      ObjectNode line = JSON.createObjectNode();
      line.put("key", vector.get("key").asText());
      line.put("murmur2", Utils.murmur2(key));
      ObjectNode partitions = line.putObject("partition");
      for (Map.Entry<String, JsonNode> count : vector.get("partition").properties()) {
        int n = Integer.parseInt(count.getKey());
        partitions.put(count.getKey(), Utils.toPositive(Utils.murmur2(key)) % n);
      }
      System.out.println(JSON.writeValueAsString(line));
    }
  }

  private int play() throws Exception {
    long timeoutMs = script.path("timeout_ms").asLong(60_000);
    for (JsonNode step : script.get("steps")) {
      String op = step.get("op").asText();
      GenericRecord record;
      String topic;
      switch (op) {
        case "intent" -> {
          record = intent(step);
          topic = prefix + "intents";
        }
        case "ack" -> {
          record = ack(step);
          topic = prefix + "acks";
        }
        case "resume" -> {
          record = resume(step);
          topic = prefix + "resumes";
        }
        default -> throw new IllegalArgumentException("unknown step op " + op);
      }
      String eventId = step.get("event_id").asText();
      if (!step.path("await").asBoolean(true)) {
        send(topic, record);
        continue;
      }
      // Position on the session's decisions partition before producing (SPEC.md 6).
      TopicPartition partition = decisionsPartition();
      consumer.assign(List.of(partition));
      consumer.seek(partition, consumer.endOffsets(List.of(partition)).get(partition));
      send(topic, record);
      ObjectNode answer = await(eventId, System.currentTimeMillis() + timeoutMs);
      if (answer == null) {
        System.err.println("no final decision for " + eventId + " within " + timeoutMs + " ms");
        return 3;
      }
      System.out.println(JSON.writeValueAsString(answer));
    }
    return 0;
  }

  private void send(String topic, GenericRecord record) throws Exception {
    byte[] key = sessionId.getBytes(StandardCharsets.UTF_8);
    producer.send(new ProducerRecord<>(topic, key, Wire.encode(record))).get();
    GenericRecord context = (GenericRecord) record.get("causal");
    if (context != null) {
      acknowledgedSeq = Math.max(acknowledgedSeq, (Long) context.get("seq"));
    }
  }

  /**
   * The causal context of the next event: it follows this runner's last acknowledged event and,
   * for a resume, the events its checkpoint named (the step's {@code after}); null when the
   * script turns it off ({@code "causal": false}, a v1/v2-style producer).
   */
  private GenericRecord causalContext(Schema schema, JsonNode step) {
    if (!causal) {
      return null;
    }
    List<Object[]> after = new ArrayList<>();
    if (acknowledgedSeq >= 0) {
      after.add(new Object[] {runnerId, acknowledgedSeq});
    }
    for (JsonNode named : step.path("after")) {
      after.add(new Object[] {named.get("producer").asText(), named.get("seq").asLong()});
    }
    return Wire.causal(schema, runnerId, nextSeq++, after);
  }

  private TopicPartition decisionsPartition() {
    int count = consumer.partitionsFor(decisions).size();
    byte[] key = sessionId.getBytes(StandardCharsets.UTF_8);
    return new TopicPartition(decisions, Utils.toPositive(Utils.murmur2(key)) % count);
  }

  private ObjectNode await(String eventId, long deadline) throws Exception {
    while (System.currentTimeMillis() < deadline) {
      for (ConsumerRecord<byte[], byte[]> message : consumer.poll(Duration.ofMillis(200))) {
        GenericRecord decision = wire.decodeDecision(message.value());
        boolean isFinal = (Boolean) decision.get("final");
        if (!isFinal || !decision.get("in_reply_to").toString().equals(eventId)) {
          continue;
        }
        ObjectNode answer = JSON.createObjectNode();
        for (String field :
            List.of("decision_id", "in_reply_to", "verdict", "reason", "classification")) {
          answer.put(field, decision.get(field).toString());
        }
        Object fence = decision.get("fence_token");
        answer.put("fence_token", fence == null ? null : (Long) fence);
        Object holder = decision.get("holder");
        answer.put("holder", holder == null ? null : holder.toString());
        Header source = message.headers().lastHeader("source");
        answer.put(
            "source",
            source == null ? null : new String(source.value(), StandardCharsets.UTF_8));
        return answer;
      }
    }
    return null;
  }

  private GenericRecord intent(JsonNode step) {
    Schema schema = wire.intent;
    Schema itemFacts = Wire.fieldType(schema, "items").getElementType();
    JsonNode before = step.get("before_tail");
    return new GenericRecordBuilder(schema)
        .set("event_id", step.get("event_id").asText())
        .set("session_id", sessionId)
        .set("event_time_ms", step.get("event_time_ms").asLong())
        .set("kind", Wire.symbol(schema, "kind", step.path("kind").asText("REGISTER")))
        .set("intent_id", step.get("intent_id").asText())
        .set("runner_id", runnerId)
        .set("fence_token", Wire.optionalLong(step.get("fence_token")))
        .set("binding", Wire.binding(schema, script.get("binding")))
        .set("before", before == null || before.isNull() ? null : Wire.digests(before, ignoreIds))
        .set("items", Wire.facts(itemFacts, step.get("items"), ignoreIds))
        .set("persisted_count", step.path("persisted_count").asLong(0))
        .set("sequence", step.get("sequence").asLong())
        .set("causal", causalContext(schema, step))
        .build();
  }

  private GenericRecord ack(JsonNode step) {
    Schema schema = wire.ack;
    JsonNode tail = step.get("observed_tail");
    return new GenericRecordBuilder(schema)
        .set("event_id", step.get("event_id").asText())
        .set("session_id", sessionId)
        .set("event_time_ms", step.get("event_time_ms").asLong())
        .set("intent_id", step.get("intent_id").asText())
        .set("runner_id", runnerId)
        .set("outcome", Wire.symbol(schema, "outcome", step.get("outcome").asText()))
        .set("source", Wire.symbol(schema, "source", "RUNNER"))
        .set("fence_token", Wire.optionalLong(step.get("fence_token")))
        .set("observed_tail", tail == null || tail.isNull() ? null : Wire.digests(tail, ignoreIds))
        .set("causal", causalContext(schema, step))
        .build();
  }

  private GenericRecord resume(JsonNode step) {
    Schema schema = wire.resume;
    JsonNode pendingSpec = step.get("pending");
    GenericRecord pending = null;
    if (pendingSpec != null && !pendingSpec.isNull()) {
      Schema pendingSchema = Wire.fieldType(schema, "pending");
      Schema itemFacts = pendingSchema.getField("items").schema().getElementType();
      JsonNode before = pendingSpec.get("before_tail");
      pending =
          new GenericRecordBuilder(pendingSchema)
              .set("intent_id", pendingSpec.get("intent_id").asText())
              .set("items", Wire.facts(itemFacts, pendingSpec.get("items"), ignoreIds))
              .set(
                  "before",
                  before == null || before.isNull() ? null : Wire.digests(before, ignoreIds))
              .set("persisted_count", pendingSpec.path("persisted_count").asLong(0))
              .build();
    }
    return new GenericRecordBuilder(schema)
        .set("event_id", step.get("event_id").asText())
        .set("session_id", sessionId)
        .set("event_time_ms", step.get("event_time_ms").asLong())
        .set("runner_id", runnerId)
        .set("checkpoint_id", step.get("checkpoint_id").asText())
        .set("binding", Wire.binding(schema, script.get("binding")))
        .set("pending", pending)
        .set("observed_tail", Wire.digests(step.get("observed_tail"), ignoreIds))
        .set("checkpoint_sequence", step.path("checkpoint_sequence").asLong(-1))
        .set("causal", causalContext(schema, step))
        .build();
  }
}
