package federator.kstreams;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.query.Position;
import org.apache.kafka.streams.query.QueryResult;
import org.apache.kafka.streams.query.StateQueryRequest;
import org.apache.kafka.streams.query.StateQueryResult;
import org.apache.kafka.streams.query.TimestampedKeyQuery;
import org.apache.kafka.streams.query.TimestampedRangeQuery;
import org.apache.kafka.streams.query.VersionedKeyQuery;
import org.apache.kafka.streams.query.WindowKeyQuery;
import org.apache.kafka.streams.query.WindowRangeQuery;
import org.apache.kafka.streams.query.Query;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.ValueAndTimestamp;
import org.apache.kafka.streams.state.VersionedRecord;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The application's own answers, by IQv2, over HTTP (JSON): what Federator's SQL must equal.
 *
 *   GET /status                                 {"state": "RUNNING"}
 *   GET /kv?store=S[&key=K]                     TimestampedRangeQuery (all) or TimestampedKeyQuery
 *   GET /window?store=S&from=MS&to=MS[&key=K]   WindowRangeQuery.withWindowStartRange, or WindowKeyQuery
 *   GET /session?store=S&key=K[&key=K...]       WindowRangeQuery.withKey (a session fetch) per key
 *   GET /versioned?store=S&key=K[&key=K...]     VersionedKeyQuery (the latest version) per key
 *
 * Rows are {"key", "value", "timestamp"} or {"key", "start", "end", "value"}; "position" is the
 * merged IQv2 Position of the answers (input topic -> partition -> offset). A failed partition
 * answers 503 with its reason.
 */
final class Oracle {
    private final KafkaStreams streams;
    private final HttpServer server;

    Oracle(final KafkaStreams streams, final int port) throws IOException {
        this.streams = streams;
        this.server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 0);
        server.createContext("/status", ex -> reply(ex, 200, "{\"state\":\"" + streams.state() + "\"}"));
        server.createContext("/kv", ex -> answer(ex, this::kv));
        server.createContext("/window", ex -> answer(ex, this::window));
        server.createContext("/session", ex -> answer(ex, this::session));
        server.createContext("/versioned", ex -> answer(ex, this::versioned));
    }

    void start() {
        server.start();
    }

    void stop() {
        server.stop(0);
    }

    /** Rows and the position they were read at. */
    private static final class Answer {
        final List<String> rows = new ArrayList<>();
        final Position position = Position.emptyPosition();
    }

    private static final class Failed extends RuntimeException {
        Failed(final String message) {
            super(message);
        }
    }

    private Answer kv(final Params p) {
        final Answer a = new Answer();
        final String key = p.first("key");
        if (key != null) {
            final TimestampedKeyQuery<String, Object> q = TimestampedKeyQuery.withKey(key);
            for (final ValueAndTimestamp<Object> v : results(p.store(), q, a)) {
                a.rows.add(kvRow(key, v.value(), v.timestamp()));
            }
            return a;
        }
        for (final KeyValueIterator<String, ValueAndTimestamp<Object>> it
                : results(p.store(), TimestampedRangeQuery.<String, Object>withNoBounds(), a)) {
            try (it) {
                it.forEachRemaining(kv -> a.rows.add(kvRow(kv.key, kv.value.value(), kv.value.timestamp())));
            }
        }
        return a;
    }

    private Answer window(final Params p) {
        final Answer a = new Answer();
        final Instant from = Instant.ofEpochMilli(Long.parseLong(p.first("from")));
        final Instant to = Instant.ofEpochMilli(Long.parseLong(p.first("to")));
        final String key = p.first("key");
        if (key != null) {
            final WindowKeyQuery<String, Object> q = WindowKeyQuery.withKeyAndWindowStartRange(key, from, to);
            for (final WindowStoreIterator<Object> it : results(p.store(), q, a)) {
                try (it) {
                    it.forEachRemaining(kv -> a.rows.add(windowRow(key, kv.key, kv.key + GameApp.WINDOW.toMillis(), kv.value)));
                }
            }
            return a;
        }
        final WindowRangeQuery<String, Object> q = WindowRangeQuery.withWindowStartRange(from, to);
        for (final KeyValueIterator<Windowed<String>, Object> it : results(p.store(), q, a)) {
            windowRows(it, a);
        }
        return a;
    }

    private Answer session(final Params p) {
        final Answer a = new Answer();
        for (final String key : p.all("key")) {
            for (final KeyValueIterator<Windowed<String>, Object> it
                    : results(p.store(), WindowRangeQuery.<String, Object>withKey(key), a)) {
                windowRows(it, a);
            }
        }
        return a;
    }

    private Answer versioned(final Params p) {
        final Answer a = new Answer();
        for (final String key : p.all("key")) {
            for (final VersionedRecord<Object> v : results(p.store(), VersionedKeyQuery.<String, Object>withKey(key), a)) {
                a.rows.add(kvRow(key, v.value(), v.timestamp()));
            }
        }
        return a;
    }

    /** The non-null results of ``query`` over every partition of ``store``; a failed one throws. */
    private <R> List<R> results(final String store, final Query<R> query, final Answer into) {
        final StateQueryResult<R> result = streams.query(StateQueryRequest.inStore(store).withQuery(query));
        final List<R> out = new ArrayList<>();
        for (final Map.Entry<Integer, QueryResult<R>> e : result.getPartitionResults().entrySet()) {
            final QueryResult<R> r = e.getValue();
            if (r.isFailure()) {
                throw new Failed(store + " partition " + e.getKey() + ": " + r.getFailureReason() + " " + r.getFailureMessage());
            }
            into.position.merge(r.getPosition());
            if (r.getResult() != null) {
                out.add(r.getResult());
            }
        }
        return out;
    }

    private static void windowRows(final KeyValueIterator<Windowed<String>, Object> it, final Answer a) {
        try (it) {
            while (it.hasNext()) {
                final KeyValue<Windowed<String>, Object> kv = it.next();
                a.rows.add(windowRow(kv.key.key(), kv.key.window().start(), kv.key.window().end(), kv.value));
            }
        }
    }

    private static String windowRow(final String key, final long start, final long end, final Object value) {
        final Object v = value instanceof ValueAndTimestamp ? ((ValueAndTimestamp<?>) value).value() : value;
        return "{\"key\":" + quote(key) + ",\"start\":" + start + ",\"end\":" + end + ",\"value\":" + json(v) + "}";
    }

    private static String kvRow(final String key, final Object value, final long timestamp) {
        return "{\"key\":" + quote(key) + ",\"value\":" + json(value) + ",\"timestamp\":" + timestamp + "}";
    }

    private static String json(final Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof Stats) {
            return ((Stats) v).toJson();
        }
        return v instanceof Number ? v.toString() : quote(v.toString());
    }

    private static String quote(final String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    private static String positionJson(final Position position) {
        final StringBuilder sb = new StringBuilder("{");
        for (final String topic : position.getTopics()) {
            sb.append(sb.length() > 1 ? "," : "").append(quote(topic)).append(":{");
            final StringBuilder parts = new StringBuilder();
            position.getPartitionPositions(topic).forEach((partition, offset) ->
                parts.append(parts.length() > 0 ? "," : "").append("\"").append(partition).append("\":").append(offset));
            sb.append(parts).append("}");
        }
        return sb.append("}").toString();
    }

    private void answer(final HttpExchange ex, final Function<Params, Answer> handler) throws IOException {
        try {
            final Answer a = handler.apply(new Params(ex.getRequestURI().getRawQuery()));
            reply(ex, 200, "{\"rows\":[" + String.join(",", a.rows) + "],\"position\":" + positionJson(a.position) + "}");
        } catch (final Failed | IllegalArgumentException | org.apache.kafka.streams.errors.StreamsException e) {
            reply(ex, 503, "{\"error\":" + quote(String.valueOf(e.getMessage())) + "}");
        } catch (final RuntimeException e) {
            e.printStackTrace();
            reply(ex, 500, "{\"error\":" + quote(e.toString()) + "}");
        }
    }

    private static void reply(final HttpExchange ex, final int status, final String body) throws IOException {
        final byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(bytes);
        }
    }

    /** A query string's parameters. */
    private static final class Params {
        private final List<String[]> pairs = new ArrayList<>();

        Params(final String raw) {
            if (raw == null) {
                return;
            }
            for (final String part : raw.split("&")) {
                final int eq = part.indexOf('=');
                if (eq > 0) {
                    pairs.add(new String[] {decode(part.substring(0, eq)), decode(part.substring(eq + 1))});
                }
            }
        }

        private static String decode(final String s) {
            return URLDecoder.decode(s, StandardCharsets.UTF_8);
        }

        String first(final String name) {
            return pairs.stream().filter(p -> p[0].equals(name)).map(p -> p[1]).findFirst().orElse(null);
        }

        List<String> all(final String name) {
            final List<String> out = new ArrayList<>();
            pairs.stream().filter(p -> p[0].equals(name)).forEach(p -> out.add(p[1]));
            return out;
        }

        String store() {
            final String store = first("store");
            if (store == null) {
                throw new IllegalArgumentException("give the store: ?store=NAME");
            }
            return store;
        }
    }
}
