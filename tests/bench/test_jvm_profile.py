"""The JVM profile's reading of `jfr print` (bench/jvm_profile.py): each sample's time and frames, and its category
by the first rule that matches any frame of its stack."""

from __future__ import annotations

from bench.jvm_profile import categorize, stacks

PRINTED = """
jdk.ExecutionSample {
  startTime = 06:32:05.120
  sampledThread = "Executor task launch worker for task 0.0 in stage 3.0 (TID 7)" (javaThreadId = 90)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.util.zip.ZipFile$Source.getEntryPos(String, boolean) line: 1781
    org.apache.spark.util.ParentClassLoader.loadClass(String, boolean) line: 40
    org.codehaus.janino.UnitCompiler.compileUnit(boolean) line: 430
    org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeProjection$.create(Seq) line: 300
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 06:32:06.500
  sampledThread = "Thread-5" (javaThreadId = 40)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.io.ObjectOutputStream$HandleTable.lookup(Object) line: 2342
    org.apache.spark.sql.delta.OptimisticTransaction.commit(Seq, DeltaOperations$Operation) line: 12
  ]
}

jdk.ExecutionSample {
  startTime = 06:32:07.000
  sampledThread = "Thread-5" (javaThreadId = 40)
  state = "STATE_RUNNABLE"
  stackTrace = [
    scala.collection.immutable.List.map(Function1) line: 1
  ]
}

jdk.ExecutionSample {
  startTime = 06:40:00.000
  sampledThread = "Thread-5" (javaThreadId = 40)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.codehaus.janino.Parser.parse() line: 1
  ]
}
"""


def test_samples_are_read_with_their_time_and_frames_top_first():
    got = stacks(PRINTED)
    assert [when for when, _ in got] == ["06:32:05.120", "06:32:06.500", "06:32:07.000", "06:40:00.000"]
    assert got[0][1][0] == "java.util.zip.ZipFile$Source.getEntryPos"
    assert got[1][1] == ["java.io.ObjectOutputStream$HandleTable.lookup",
                         "org.apache.spark.sql.delta.OptimisticTransaction.commit"]


def test_the_first_matching_category_names_a_sample_and_only_the_windows_count():
    counts = categorize(stacks(PRINTED), [("06:32:05.000", "06:32:07.500")])
    # Janino's compilation wins over the projection that asked for it; serialization over the Delta commit that
    # serialized; a stack no rule knows is "other"; the sample at 06:40 is outside the window.
    assert counts == {"codegen: compiling (Janino, its class lookups)": 1, "task and closure serialization": 1,
                      "other": 1}
