package federator.kstreams;

/** One round of a game, as the input topic carries it: "game,score,epoch-ms" under the player's key. */
public final class GameResult {
    public final String game;
    public final long score;
    public final long time;

    GameResult(final String game, final long score, final long time) {
        this.game = game;
        this.score = score;
        this.time = time;
    }

    public static GameResult parse(final String value) {
        final String[] parts = value.split(",");
        return new GameResult(parts[0], Long.parseLong(parts[1]), Long.parseLong(parts[2]));
    }
}
