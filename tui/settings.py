"""The user's remembered choices: a small JSON file in the user's config folder.

The folder is `platformdirs.user_config_dir("kvscope")`, or `$KVSCOPE_CONFIG_DIR` when set
(tests point it at a temporary folder so they never read or write the user's real file).
Nothing is read at import time: `AppSettings.load()` is called by whoever builds the app.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import platformdirs

from engine.paths import private_dir, write_private

CONFIG_DIR_ENV = "KVSCOPE_CONFIG_DIR"
SETTINGS_FILE = "settings.json"
DEFAULT_THEME = "kvscope-dark"


def config_dir() -> Path:
    """The folder settings live in, honouring `$KVSCOPE_CONFIG_DIR`."""
    override = os.environ.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir("kvscope"))


@dataclass
class AppSettings:
    """What kvscope remembers between runs."""

    theme: str = DEFAULT_THEME
    """Name of the Textual theme; an unknown name falls back to the default at mount."""
    cursor_blink: bool = True
    """Blinking text cursors; tests turn it off so snapshots do not depend on timing."""
    folder: Path | None = field(default=None, compare=False)
    """Where the file is read from and saved to; None means `config_dir()` at save time."""
    problem: str | None = field(default=None, compare=False)
    """Why the saved file could not be used, if it could not; the app tells the user."""

    @property
    def path(self) -> Path:
        return (self.folder or config_dir()) / SETTINGS_FILE

    @classmethod
    def load(cls, folder: Path | None = None) -> AppSettings:
        """Read the settings file; a missing or broken file gives the defaults.

        A broken file is not an error the user should be stopped by: the defaults are used
        and `problem` says what was wrong, so the app can show it once.
        """
        folder = folder or config_dir()
        settings = cls(folder=folder)
        path = settings.path
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return settings
        except OSError as exc:
            settings.problem = f"could not read {path}: {exc.strerror or exc}"
            return settings
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            settings.problem = f"{path} is not valid JSON ({exc.msg}); using the defaults"
            return settings
        if not isinstance(data, dict):
            settings.problem = f"{path} does not hold a JSON object; using the defaults"
            return settings
        settings._apply(data)
        return settings

    def _apply(self, data: dict[str, Any]) -> None:
        # Keys from a newer or older kvscope are ignored, and a value of the wrong type
        # keeps the default, so one bad entry never loses the others.
        for f in fields(self):
            if f.name in ("folder", "problem") or f.name not in data:
                continue
            default = getattr(self, f.name)
            value = data[f.name]
            if isinstance(value, type(default)):
                setattr(self, f.name, value)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("folder", "problem")
        }

    def save(self, only: tuple[str, ...] | None = None) -> Path:
        """Write the settings atomically (a temporary file, then a rename); returns the path.

        With `only`, just those keys are written into the file as it is now: every other
        key, known to this kvscope or not (a newer kvscope's, the user's own), is kept as
        it was. A file that is not a JSON object is kept beside it as `settings.json.bad`
        rather than lost. Raises OSError when the folder cannot be written; the caller
        tells the user.
        """
        path = self.path
        private_dir(path.parent)
        data: dict[str, Any] = {}
        if only is not None:
            data = self._current_file(path)
            mine = self.to_dict()
            data.update({key: mine[key] for key in only if key in mine})
        else:
            data = self.to_dict()
        return write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    @staticmethod
    def _current_file(path: Path) -> dict[str, Any]:
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            return data
        write_private(path.with_suffix(".json.bad"), raw)
        return {}
