"""jaxppo.registry: one named registry style (register decorator, lookup listing the known names, names())."""

import pytest

from jaxppo.registry import Registry, UnknownNameError


def test_register_get_names_unregister():
    reg = Registry("thing")

    @reg.register("b")
    def b():
        return 2

    assert reg.register("a")(len) is len          # the decorated function is returned unchanged
    assert reg.names() == ("a", "b") and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.get("b") is b and "b" in reg and "c" not in reg
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'c'; known: a, b$"):
        reg.get("c")
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a")(b)
    reg.unregister("a")
    assert reg.names() == ("b",)
    with pytest.raises(UnknownNameError):
        reg.unregister("a")


def test_wrap_stores_the_entry_with_its_options():
    reg = Registry("estimator", wrap=lambda name, fn, *, flag=False: (name, fn, flag))

    @reg.register("x", flag=True)
    def x():
        pass

    assert reg.get("x") == ("x", x, True)
    with pytest.raises(TypeError, match="takes no options"):
        Registry("plain").register("y", flag=True)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    with pytest.raises(UnknownNameError, match="unknown estimator"):
        reg.get(["unhashable"])
