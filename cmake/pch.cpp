// The precompiled header's own translation unit (ampactor_lib_pch): empty.
