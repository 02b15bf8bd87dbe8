package federator.kstreams;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/** A player's totals: rounds played, total and best score, the last round's time (epoch ms).
 *  Kept as a flat JSON object, the way many applications serialize their aggregates. */
public final class Stats {
    public final long rounds;
    public final long totalScore;
    public final long bestScore;
    public final long lastSeen;

    public Stats() {
        this(0, 0, 0, 0);
    }

    Stats(final long rounds, final long totalScore, final long bestScore, final long lastSeen) {
        this.rounds = rounds;
        this.totalScore = totalScore;
        this.bestScore = bestScore;
        this.lastSeen = lastSeen;
    }

    public Stats add(final GameResult r) {
        return new Stats(rounds + 1, totalScore + r.score, Math.max(bestScore, r.score), Math.max(lastSeen, r.time));
    }

    public String toJson() {
        return "{\"rounds\":" + rounds + ",\"total_score\":" + totalScore + ",\"best_score\":" + bestScore
            + ",\"last_seen\":" + lastSeen + "}";
    }

    /** The inverse of toJson (a flat object of numbers). */
    public static Stats fromJson(final String json) {
        final Map<String, Long> fields = new LinkedHashMap<>();
        for (final String pair : json.replaceAll("[{}\"\\s]", "").split(",")) {
            final String[] kv = pair.split(":");
            fields.put(kv[0], Long.parseLong(kv[1]));
        }
        return new Stats(fields.get("rounds"), fields.get("total_score"), fields.get("best_score"), fields.get("last_seen"));
    }

    public static final Serde<Stats> SERDE = Serdes.serdeFrom(
        (Serializer<Stats>) (topic, s) -> s == null ? null : s.toJson().getBytes(StandardCharsets.UTF_8),
        (Deserializer<Stats>) (topic, b) -> b == null ? null : fromJson(new String(b, StandardCharsets.UTF_8)));
}
