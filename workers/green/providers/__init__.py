"""Where grid carbon intensity comes from, best source first, each answer an :class:`IntensitySeries`.

1. Live providers, off unless configured (nothing reaches the internet unless asked; see
   :func:`configured_providers`):

   - Electricity Maps API v3 (``carbon-intensity/history``: the last 24 h, measured; ``carbon-intensity/
     forecast``), header ``auth-token``. Consumption-based average intensity per zone (``DE``,
     ``US-CAL-CISO``...).
   - WattTime API v3 (``/login`` with HTTP basic auth for a token, then ``/v3/historical`` and
     ``/v3/forecast`` with ``signal_type=co2_moer``): the *marginal* operating emissions rate of a grid
     region (``CAISO_NORTH``...), in lbs CO2/MWh, converted here to g/kWh.
   - UK Carbon Intensity API (National Energy System Operator, ``api.carbonintensity.org.uk``, no key):
     national Great Britain, 30-min periods, ``/intensity/{from}/fw48h`` and ``/intensity/{from}/{to}``.

2. A forecast CSV uploaded by the user (:func:`parse_forecast_csv`).
3. The shipped measured 2020 history for GB and DE (:func:`history_stand_in`), moved onto the requested
   dates when they lie outside it, and labelled ``history`` so no page passes it off as a forecast.
4. CodeCarbon's bundled annual country averages (:func:`country_average`), one value for the whole year.

:func:`resolve_series` walks that order for a zone and a window and says why each better source was not
used. Every HTTP failure is a :class:`ProviderError` naming the provider, the HTTP status and the
provider's own message.

The rooms: :mod:`~.http` (the protocol, the error and the HTTP client), one module per live provider
(:mod:`~.electricitymaps`, :mod:`~.watttime`, :mod:`~.uk_carbon_intensity`), :mod:`~.config` (which ones the
environment switches on), :mod:`~.upload` (the CSV), :mod:`~.stand_ins` (history and country averages),
:mod:`~.resolve` (walking the order).
"""

from workers.green.providers.config import configured_providers
from workers.green.providers.electricitymaps import (
    ELECTRICITYMAPS_URL,
    ENV_ELECTRICITYMAPS_TOKEN,
    ENV_ELECTRICITYMAPS_URL,
    ElectricityMaps,
)
from workers.green.providers.http import DEFAULT_TIMEOUT_S, HTTPProvider, IntensityProvider, ProviderError
from workers.green.providers.resolve import resolve_series
from workers.green.providers.stand_ins import (
    CODECARBON_MIX_FILE,
    CODECARBON_UNDERLYING,
    HISTORY_YEAR,
    average_countries,
    country_average,
    history_stand_in,
)
from workers.green.providers.uk_carbon_intensity import (
    ENV_UK_CARBON_INTENSITY,
    ENV_UK_CARBON_INTENSITY_URL,
    UK_CARBON_INTENSITY_URL,
    UKCarbonIntensity,
)
from workers.green.providers.upload import (
    CSV_INTENSITY_COLUMNS,
    CSV_TIME_COLUMNS,
    MAX_CSV_ROWS,
    parse_forecast_csv,
)
from workers.green.providers.watttime import (
    ENV_WATTTIME_PASSWORD,
    ENV_WATTTIME_URL,
    ENV_WATTTIME_USERNAME,
    G_PER_KWH_PER_LB_PER_MWH,
    WATTTIME_URL,
    WattTime,
)

__all__ = [
    "CODECARBON_MIX_FILE",
    "CODECARBON_UNDERLYING",
    "CSV_INTENSITY_COLUMNS",
    "CSV_TIME_COLUMNS",
    "DEFAULT_TIMEOUT_S",
    "ELECTRICITYMAPS_URL",
    "ENV_ELECTRICITYMAPS_TOKEN",
    "ENV_ELECTRICITYMAPS_URL",
    "ENV_UK_CARBON_INTENSITY",
    "ENV_UK_CARBON_INTENSITY_URL",
    "ENV_WATTTIME_PASSWORD",
    "ENV_WATTTIME_URL",
    "ENV_WATTTIME_USERNAME",
    "G_PER_KWH_PER_LB_PER_MWH",
    "HISTORY_YEAR",
    "MAX_CSV_ROWS",
    "UK_CARBON_INTENSITY_URL",
    "WATTTIME_URL",
    "ElectricityMaps",
    "HTTPProvider",
    "IntensityProvider",
    "ProviderError",
    "UKCarbonIntensity",
    "WattTime",
    "average_countries",
    "configured_providers",
    "country_average",
    "history_stand_in",
    "parse_forecast_csv",
    "resolve_series",
]
