import java.sql.*;

/** What DBeaver's navigator reads through pgjdbc's DatabaseMetaData when it opens a connection and
 *  expands a schema: catalogs, schemas, tables and views, then per table its columns, primary key,
 *  foreign keys and indexes, and the server's types. Prints lines the Python test compares. */
public class JdbcMetadataWalk {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0], "tester", "")) {
            DatabaseMetaData md = c.getMetaData();
            try (ResultSet rs = md.getCatalogs()) {
                while (rs.next()) System.out.println("catalog " + rs.getString("TABLE_CAT"));
            }
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) System.out.println("schema " + rs.getString("TABLE_SCHEM"));
            }
            java.util.List<String> tables = new java.util.ArrayList<>();
            try (ResultSet rs = md.getTables(null, "public", "%", new String[]{"TABLE", "VIEW"})) {
                while (rs.next()) {
                    tables.add(rs.getString("TABLE_NAME"));
                    System.out.println("table " + rs.getString("TABLE_SCHEM") + " " + rs.getString("TABLE_NAME") + " "
                            + rs.getString("TABLE_TYPE"));
                }
            }
            for (String t : tables) {
                try (ResultSet rs = md.getColumns(null, "public", t, "%")) {
                    while (rs.next()) System.out.println("column " + t + " " + rs.getInt("ORDINAL_POSITION") + " "
                            + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME") + " " + rs.getInt("DATA_TYPE")
                            + " " + rs.getInt("NULLABLE") + " " + rs.getString("IS_NULLABLE"));
                }
                try (ResultSet rs = md.getPrimaryKeys(null, "public", t)) {
                    while (rs.next()) System.out.println("pk " + t + " " + rs.getString("COLUMN_NAME") + " "
                            + rs.getInt("KEY_SEQ") + " " + rs.getString("PK_NAME"));
                }
                try (ResultSet rs = md.getImportedKeys(null, "public", t)) {
                    while (rs.next()) System.out.println("fk " + t + " " + rs.getString("FKCOLUMN_NAME") + " "
                            + rs.getString("PKTABLE_NAME") + "." + rs.getString("PKCOLUMN_NAME"));
                }
                try (ResultSet rs = md.getIndexInfo(null, "public", t, false, true)) {
                    while (rs.next()) System.out.println("index " + t + " " + rs.getString("INDEX_NAME") + " "
                            + rs.getString("COLUMN_NAME") + " " + rs.getInt("ORDINAL_POSITION") + " "
                            + (rs.getBoolean("NON_UNIQUE") ? "non-unique" : "unique"));
                }
            }
            try (ResultSet rs = md.getTypeInfo()) {
                while (rs.next()) System.out.println("type " + rs.getString("TYPE_NAME") + " " + rs.getInt("DATA_TYPE"));
            }
        }
    }
}
