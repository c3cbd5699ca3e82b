"""The fix search: from a failing case's first divergent module to the replacement arms that
make the two sides agree, each tried as a sealed case of the same experiment (docs/fix.md).

``service.fix_case`` is the one flow (``xconf fix RUN_DIR CASE_ID`` and ``fix=true`` on
``xconf-run`` call it); ``ladder`` proposes the arms, ``cases`` runs them as cases,
``evidence`` reads what each case showed.
"""
