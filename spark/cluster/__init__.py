"""Running the jobs on a Spark standalone cluster: start a master and workers from the
installed PySpark, and ship this repository's packages to the executors as --py-files."""
