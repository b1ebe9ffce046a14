// Make one broker the preferred (first) replica of a partition and elect it leader, with the
// Kafka admin client's reassignment API (confluent-kafka has no partition reassignment):
//
//     java -cp '<kafka libs>/*' tools/kafka/PreferredLeader.java BOOTSTRAP TOPIC PARTITION NODE
//
// The replica set stays the same, only its order changes, so no data moves. Used by
// tools/kafka_cluster.py (`Cluster.make_preferred_leader`) to put the group coordinator
// (__consumer_offsets-0) on a chosen broker, so a fault test can kill it on purpose.

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ElectionNotNeededException;

public class PreferredLeader {
    public static void main(String[] args) throws Exception {
        String topic = args[1];
        TopicPartition partition = new TopicPartition(topic, Integer.parseInt(args[2]));
        int node = Integer.parseInt(args[3]);
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", args[0]))) {
            TopicDescription described =
                    admin.describeTopics(Set.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS)
                            .get(topic);
            List<Integer> replicas = new ArrayList<>();
            replicas.add(node);
            for (Node replica : described.partitions().get(partition.partition()).replicas()) {
                if (replica.id() != node) {
                    replicas.add(replica.id());
                }
            }
            if (replicas.size() < 2) {
                throw new IllegalArgumentException(node + " is not a replica of " + partition);
            }
            admin.alterPartitionReassignments(
                            Map.of(partition, Optional.of(new NewPartitionReassignment(replicas))))
                    .all()
                    .get(30, TimeUnit.SECONDS);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (!admin.listPartitionReassignments(Set.of(partition))
                    .reassignments()
                    .get(30, TimeUnit.SECONDS)
                    .isEmpty()) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("reassignment of " + partition + " not done");
                }
                Thread.sleep(200);
            }
            try {
                admin.electLeaders(ElectionType.PREFERRED, Set.of(partition))
                        .all()
                        .get(30, TimeUnit.SECONDS);
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof ElectionNotNeededException)) {
                    throw e;
                }
            }
            System.out.println(partition + ": replicas " + replicas + ", leader " + node);
        }
    }
}
