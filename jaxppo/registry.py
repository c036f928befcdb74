"""Name -> function registries, the ground floor of jaxppo: this module imports nothing from jaxppo.

Every pluggable choice a config names goes through one :class:`Registry`:

==========================  ==================================  ==============================
registry                    lives in                            config key
==========================  ==================================  ==============================
``ADVANTAGE_ESTIMATORS``    ``jaxppo.ops.group_advantages``     ``algorithm.adv_estimator``
``PRIORITIES``              ``jaxppo.ops.priorities``           ``replay.priority``
``PF_FILTERS``              ``jaxppo.replay.pf_ppo``            ``pf_ppo.filter``
``PF_REWEIGHTS``            ``jaxppo.replay.pf_ppo``            ``pf_ppo.reweight_method``
``POLICY_LOSSES``           ``jaxppo.trainer.ppo.policy_losses``         ``actor.policy_loss``
``REWARDS``                 ``jaxppo.rewards.registry``         ``reward.kind``
==========================  ==================================  ==============================

Adding one is one function and one decorator, ``@REGISTRY.register("name")`` (``docs/extending.md``). A
registry built with ``wrap`` stores ``wrap(name, fn, **options)`` (e.g. an estimator with its ``needs_critic``
flag) and the decorator takes those options; the decorated function itself is returned unchanged. Names are
checked once, before any model loads, by ``jaxppo.config_names.check_config_names``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(ValueError):
    """A name that no entry of the registry has; the message lists the known names."""


class Registry(Generic[T]):
    """A named mapping ``name -> entry`` filled by the :meth:`register` decorator.

    ``kind`` names the registry in messages ("advantage estimator"); ``wrap(name, fn, **options)`` (optional)
    builds the stored entry from the decorated function."""

    def __init__(self, kind: str, *, wrap: Callable[..., T] | None = None):
        self.kind = kind
        self._wrap = wrap
        self._entries: dict[str, T] = {}

    def register(self, name: str, **options: Any) -> Callable[[F], F]:
        """Decorator: store ``fn`` (or ``wrap(name, fn, **options)``) under ``name``; a taken name is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")
        if options and self._wrap is None:
            raise TypeError(f"{self.kind} registry takes no options, got {sorted(options)}")

        def deco(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = self._wrap(name, fn, **options) if self._wrap is not None else fn
            return fn

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and notebooks that register temporary entries); unknown names are an error."""
        self.get(name)
        del self._entries[name]

    def get(self, name: str) -> T:
        """The entry ``name``; :class:`UnknownNameError` listing the known names otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
