import java.sql.*;

/** What a JDBC tool does on connect, through pgjdbc: metadata, then a prepared statement with
 *  parameters read in pages (fetch size). Prints lines the Python test compares. */
public class PgjdbcCheck {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String user = args.length > 1 ? args[1] : "tester";
        String password = args.length > 2 ? args[2] : "";
        try (Connection c = DriverManager.getConnection(url, user, password)) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println("product " + md.getDatabaseProductName() + " " + md.getDatabaseMajorVersion());
            try (ResultSet rs = md.getTables(null, "public", "%", new String[]{"TABLE"})) {
                while (rs.next()) System.out.println("table " + rs.getString("TABLE_SCHEM") + "." + rs.getString("TABLE_NAME"));
            }
            try (ResultSet rs = md.getColumns(null, "public", "players", "%")) {
                while (rs.next()) System.out.println("column " + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME")
                        + " " + rs.getInt("DATA_TYPE") + " " + rs.getString("IS_NULLABLE"));
            }
            try (ResultSet rs = md.getPrimaryKeys(null, "public", "players")) {
                while (rs.next()) System.out.println("pk " + rs.getString("COLUMN_NAME") + " " + rs.getInt("KEY_SEQ")
                        + " " + rs.getString("PK_NAME"));
            }
            if (args.length > 3) return;  // metadata only
            c.setAutoCommit(false);  // a fetch size pages only inside a transaction
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT player, games, score, last_seen FROM public.players WHERE games > ? AND team = ? ORDER BY player")) {
                ps.setFetchSize(3);
                ps.setLong(1, 20);
                ps.setString(2, "red");
                for (int round = 0; round < 6; round++) {  // past pgjdbc's prepare threshold: a named statement
                    try (ResultSet rs = ps.executeQuery()) {
                        int n = 0;
                        while (rs.next()) {
                            if (round == 5) System.out.println("row " + rs.getString(1) + " " + rs.getLong(2) + " "
                                    + rs.getObject(3) + " " + (rs.getTimestamp(4) == null ? "null" : rs.getTimestamp(4).getTime()));
                            n++;
                        }
                        if (round == 5) System.out.println("rows " + n);
                    }
                }
            }
            c.commit();
        }
    }
}
