"""The round-trip counter's attribution (bench/py4j_calls.py): a call is counted under the first frame of replab's
own code on its stack, past the frames of libraries and of the counter itself."""

import sys

from bench.py4j_calls import call_site


def test_a_call_is_named_by_the_first_frame_of_replabs_code():
    here = sys._getframe()
    assert call_site(here) == f"tests/bench/test_py4j_calls.py:{here.f_lineno} {here.f_code.co_name}"
    library = compile("import sys\nframe = sys._getframe()", "/usr/lib/python3/site-packages/py4j/x.py", "exec")
    scope: dict = {}
    exec(library, scope)  # a frame outside the repository, called from this test: the test's frame names it
    assert call_site(scope["frame"]).startswith("tests/bench/test_py4j_calls.py:")
    assert call_site(None) == "(no replab frame)"
