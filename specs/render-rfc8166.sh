#!/usr/bin/env bash
# Renders specs/rfc8166.xml (RFC 8166's published XML, kept byte-exact) into specs/rfc8166.txt,
# the paginated plain text duvet reads. Needs xml2rfc from PyPI:
#   python3 -m venv /tmp/x2r && /tmp/x2r/bin/pip install xml2rfc
#   XML2RFC=/tmp/x2r/bin/xml2rfc bash specs/render-rfc8166.sh
# The XML pulls its reference entries from the IETF bibliography service by `<?rfc include?>`;
# offline, this script writes those entries itself (title, authors, date, RFC number: the
# facts the References section prints) into a scratch directory that xml2rfc searches first.
# Non-breaking spaces are made plain afterwards (duvet 0.4.3 panics on them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
XML2RFC=${XML2RFC:-xml2rfc}
lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
cp rfc8166.xml "$lib/"

# ref NUMBER "TITLE" MONTH YEAR "INITIALS|SURNAME" ...
ref() {
    local num=$1 title=$2 month=$3 year=$4
    shift 4
    {
        printf '<reference anchor="RFC%s" target="https://www.rfc-editor.org/info/rfc%s">\n' "$num" "$((10#$num))"
        printf '<front>\n<title>%s</title>\n' "$title"
        local a
        for a in "$@"; do
            printf '<author initials="%s" surname="%s"><organization/></author>\n' "${a%%|*}" "${a##*|}"
        done
        printf '<date month="%s" year="%s"/>\n</front>\n' "$month" "$year"
        printf '<seriesInfo name="RFC" value="%s"/>\n' "$((10#$num))"
        printf '<seriesInfo name="DOI" value="10.17487/RFC%s"/>\n</reference>\n' "$num"
    } >"$lib/reference.RFC.$num.xml"
}
ref 0768 "User Datagram Protocol" August 1980 "J.|Postel"
ref 0793 "Transmission Control Protocol" September 1981 "J.|Postel"
ref 1094 "NFS: Network File System Protocol specification" March 1989 "B.|Nowicki"
ref 1813 "NFS Version 3 Protocol Specification" June 1995 "B.|Callaghan" "B.|Pawlowski" "P.|Staubach"
ref 1833 "Binding Protocols for ONC RPC Version 2" August 1995 "R.|Srinivasan"
ref 2119 "Key words for use in RFCs to Indicate Requirement Levels" March 1997 "S.|Bradner"
ref 4506 "XDR: External Data Representation Standard" May 2006 "M.|Eisler"
ref 5040 "A Remote Direct Memory Access Protocol Specification" October 2007 \
    "R.|Recio" "B.|Metzler" "P.|Culley" "J.|Hilland" "D.|Garcia"
ref 5041 "Direct Data Placement over Reliable Transports" October 2007 \
    "H.|Shah" "J.|Pinkerton" "R.|Recio" "P.|Culley"
ref 5042 "Direct Data Placement Protocol (DDP) / Remote Direct Memory Access Protocol (RDMAP) Security" \
    October 2007 "J.|Pinkerton" "E.|Deleganes"
ref 5056 "On the Use of Channel Bindings to Secure Channels" November 2007 "N.|Williams"
ref 5531 "RPC: Remote Procedure Call Protocol Specification Version 2" May 2009 "R.|Thurlow"
ref 5532 "Network File System (NFS) Remote Direct Memory Access (RDMA) Problem Statement" May 2009 \
    "T.|Talpey" "C.|Juszczak"
ref 5660 "IPsec Channels: Connection Latching" October 2009 "N.|Williams"
ref 5661 "Network File System (NFS) Version 4 Minor Version 1 Protocol" January 2010 \
    "S.|Shepler" "M.|Eisler" "D.|Noveck"
ref 5662 "Network File System (NFS) Version 4 Minor Version 1 External Data Representation Standard (XDR) Description" \
    January 2010 "S.|Shepler" "M.|Eisler" "D.|Noveck"
ref 5665 "IANA Considerations for Remote Procedure Call (RPC) Network Identifiers and Universal Address Formats" \
    January 2010 "M.|Eisler"
ref 5666 "Remote Direct Memory Access Transport for Remote Procedure Call" January 2010 \
    "T.|Talpey" "B.|Callaghan"
ref 5667 "Network File System (NFS) Direct Data Placement" January 2010 "T.|Talpey" "B.|Callaghan"
ref 7530 "Network File System (NFS) Version 4 Protocol" March 2015 "T.|Haynes" "D.|Noveck"
ref 7861 "Remote Procedure Call (RPC) Security Version 3" November 2016 "A.|Adamson" "N.|Williams"
ref 8174 "Ambiguity of Uppercase vs Lowercase in RFC 2119 Key Words" May 2017 "B.|Leiba"

XML_LIBRARY="$lib" "$XML2RFC" --legacy --text --no-network --quiet \
    "$lib/rfc8166.xml" -o "$lib/rfc8166.txt"
python3 - "$lib/rfc8166.txt" rfc8166.txt <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read().replace("\u00a0", " ")
text.encode("ascii")  # the rendering must be plain ASCII for duvet
open(sys.argv[2], "w", encoding="ascii", newline="\n").write(text)
PY
echo "specs/rfc8166.txt: $(wc -l <rfc8166.txt) lines"
