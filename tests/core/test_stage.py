"""``@stage`` returns the function unchanged and rejects malformed declarations."""

import pytest

from initpipe import StageDeclarationError, get_spec, stage


def test_stage_returns_the_function_unchanged_and_callable():
    def f(x, y):
        return x + y

    assert stage(needs="model")(f) is f
    assert f(1, 2) == 3
    spec = get_spec(f)
    assert spec.inputs == ("x", "y")
    assert spec.provides == ("f",)
    assert spec.needs == "model"
    assert spec.qualname.endswith(
        ":test_stage_returns_the_function_unchanged_and_callable.<locals>.f"
    )


def test_provides_one_or_many_keys_and_doc_first_line():
    @stage(
        needs="kv_cache_config",
        provides=("a", "b"),
        effects="layer.kv_cache",
        after="x",
        before=("y",),
    )
    def f(kv_cache_config):
        """Split the config.

        More text."""
        return {"a": 1, "b": 2}

    spec = get_spec(f)
    assert spec.provides == ("a", "b") and spec.multi
    assert spec.effects == ("layer.kv_cache",)
    assert spec.after == ("x",) and spec.before == ("y",)
    assert spec.doc == "Split the config."


def test_teardown_receives_named_stage_inputs():
    def undo(out, device):
        return out, device

    @stage(needs="kv_cache_config", teardown=undo)
    def alloc(kv_cache_config, device):
        return 1

    assert get_spec(alloc).teardown_inputs == ("device",)


def test_unknown_needs_is_rejected():
    with pytest.raises(StageDeclarationError, match=r"needs='kv' is unknown.*needs='model'") as e:

        @stage(needs="kv")
        def f(x):
            return x

    assert e.value.field == "needs"
    assert e.value.stage.endswith(".f")
    assert "needs='kv_cache_config'" in str(e.value)


def test_non_callable_is_rejected():
    with pytest.raises(StageDeclarationError, match="plain function") as e:
        stage(needs="model")(42)
    assert e.value.field == "func" and e.value.stage == "42"


def test_class_is_rejected():
    with pytest.raises(StageDeclarationError, match="plain function"):

        @stage(needs="model")
        class C:
            pass


def test_generator_function_is_rejected():
    with pytest.raises(StageDeclarationError, match="generator functions are not supported") as e:

        @stage(needs="model")
        def gen(model):
            yield model

    assert e.value.field == "func" and e.value.stage.endswith(".gen")


def test_async_function_is_rejected():
    with pytest.raises(StageDeclarationError, match="async functions are not supported") as e:

        @stage(needs="model")
        async def coro(model):
            return model

    assert e.value.field == "func" and e.value.stage.endswith(".coro")


def test_var_args_are_rejected():
    with pytest.raises(StageDeclarationError, match=r"'kwargs' is \*args/\*\*kwargs") as e:

        @stage(needs="model")
        def f(model, **kwargs):
            return model

    assert e.value.field == "func"

    with pytest.raises(StageDeclarationError, match=r"'inputs' is \*args") as e:

        @stage(needs="model")
        def loose(*inputs):
            return 0

    assert e.value.field == "func"


def test_non_callable_teardown_is_rejected():
    with pytest.raises(StageDeclarationError, match=r"teardown='oops' is not callable") as e:

        @stage(needs="model", teardown="oops")
        def f(model):
            return model

    assert e.value.field == "teardown" and e.value.stage.endswith(".f")


def test_teardown_naming_a_non_input_is_rejected():
    def undo(out, nonsense):
        pass

    with pytest.raises(StageDeclarationError, match=r"names 'nonsense', which are not inputs") as e:

        @stage(needs="model", teardown=undo)
        def f(model):
            return model

    assert e.value.field == "teardown"
    assert "not inputs of the stage (inputs: model)" in str(e.value)


def test_teardown_without_parameters_is_rejected():
    with pytest.raises(StageDeclarationError, match="takes no parameter") as e:

        @stage(needs="model", teardown=lambda: None)
        def f(model):
            return model

    assert e.value.field == "teardown"


def test_output_that_is_also_an_input_is_rejected():
    with pytest.raises(StageDeclarationError, match="'model' is both an input and an output"):

        @stage(needs="model", provides="model")
        def f(model):
            return model


def test_empty_or_repeated_provides_is_rejected():
    with pytest.raises(StageDeclarationError, match="must be a key"):

        @stage(needs="model", provides=())
        def f(model):
            return model

    with pytest.raises(StageDeclarationError, match="repeats a key"):

        @stage(needs="model", provides=("a", "a"))
        def g(model):
            return model


def test_meta_is_kept_read_only_and_does_not_change_the_stage():
    @stage(needs="model", meta={"mirrors": ["host:A.b", "host:c"], "version": 2, "hot": True})
    def s(model):
        return 1

    spec = get_spec(s)
    assert dict(spec.meta) == {"mirrors": ("host:A.b", "host:c"), "version": 2, "hot": True}
    with pytest.raises(TypeError):
        spec.meta["mirrors"] = ()  # type: ignore[index]
    assert hash(spec) == hash(spec)  # a spec stays hashable with its mapping

    @stage(needs="model")
    def bare(model):
        return 1

    assert dict(get_spec(bare).meta) == {}


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        (["mirrors"], "must be a mapping"),
        ({1: "x"}, "meta key 1 must be a non-empty string"),
        ({"": "x"}, "meta key '' must be a non-empty string"),
        ({"calls": ["a", 3]}, r"meta\['calls'\]=\['a', 3\]: a sequence must hold strings only"),
        ({"obj": object()}, r"meta\['obj'\] is a object; use a string, number"),
    ],
)
def test_bad_meta_is_refused_naming_the_field(meta, says):
    with pytest.raises(StageDeclarationError, match=says) as e:

        @stage(needs="model", meta=meta)
        def s(model):
            return 1

    assert e.value.field == "meta"
