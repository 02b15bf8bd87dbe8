"""Arrow Flight SQL front door (`federator node --flight-sql-port`): statements, prepared statements and catalog calls over gRPC."""
