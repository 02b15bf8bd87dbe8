package federator.kstreams;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The game as a Kafka Streams application: rounds played ("game,score,epoch-ms" under the
 * player's key) into four RocksDB stores with changelogs, and player levels (a long under the
 * player's key, from a rating service whose updates may arrive out of order) into a versioned
 * table.
 *
 *   java -cp 'OUT/*:OUT/lib/*' federator.kstreams.GameApp BOOTSTRAP APPLICATION_ID STATE_DIR HTTP_PORT \
 *       RESULTS_TOPIC LEVELS_TOPIC
 *
 * It answers its own interactive queries over HTTP on HTTP_PORT (Oracle).
 */
public final class GameApp {
    static final Duration RETENTION = Duration.ofDays(30);  // windows, sessions and level history kept
    static final Duration GRACE = Duration.ofDays(7);  // late rounds still counted in their window
    static final Duration WINDOW = Duration.ofMinutes(1);  // scores per minute

    public static Topology topology(final String resultsTopic, final String levelsTopic) {
        final StreamsBuilder builder = new StreamsBuilder();
        final KStream<String, String> rounds = builder.stream(resultsTopic, Consumed.with(Serdes.String(), Serdes.String()));
        final KGroupedStream<String, Long> scores = rounds
            .mapValues(round -> GameResult.parse(round).score)
            .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()));

        // per-player totals: a timestamped key-value store
        rounds.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .aggregate(Stats::new, (player, round, stats) -> stats.add(GameResult.parse(round)),
                Materialized.<String, Stats, KeyValueStore<Bytes, byte[]>>as("player_totals")
                    .withKeySerde(Serdes.String()).withValueSerde(Stats.SERDE));

        // scores per minute: tumbling windows
        scores.windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
            .reduce(Long::sum, Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("scores_per_minute")
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()).withRetention(RETENTION));

        // play sessions: a new one after 30 minutes without a round; the value counts its rounds
        scores.windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMinutes(30), GRACE))
            .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("player_sessions")
                .withKeySerde(Serdes.String()).withRetention(RETENTION));

        // player levels: a versioned table, whose latest value has the newest timestamp
        builder.table(levelsTopic, Consumed.with(Serdes.String(), Serdes.Long()),
            Materialized.<String, Long>as(Stores.persistentVersionedKeyValueStore("player_levels", RETENTION))
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()));
        return builder.build();
    }

    public static void main(final String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: GameApp BOOTSTRAP APPLICATION_ID STATE_DIR HTTP_PORT RESULTS_TOPIC LEVELS_TOPIC");
            System.exit(2);
        }
        final Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[2]);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);  // the tests wait for the commits
        final KafkaStreams streams = new KafkaStreams(topology(args[4], args[5]), props);
        final Oracle oracle = new Oracle(streams, Integer.parseInt(args[3]));
        final CountDownLatch stopped = new CountDownLatch(1);
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            oracle.stop();
            streams.close(Duration.ofSeconds(20));
            stopped.countDown();
        }));
        streams.start();
        oracle.start();
        System.out.println("oracle listening on port " + args[3]);
        stopped.await();
    }
}
