// The object the shared precompiled header (pch.h) is built with.
