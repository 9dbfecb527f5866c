# vramlab report: gnuplot mem_by_category.gp in this folder re-renders mem_by_category.png
if (!exists("vl_png")) vl_png = 'mem_by_category.png'
set terminal png size 1000,560 noenhanced
set output vl_png
set title 'Peak memory by category per rung (planned, full scale, batch as configured)'
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set ylabel 'GB'
set key outside right
set xtics rotate by -30
set yrange [0:*]
plot 'mem_by_category.dat' using 3:xtic(2) title columnheader(3) lc rgb '#7b3294', '' using 4 title columnheader(4) lc rgb '#1b9e77', '' using 5 title columnheader(5) lc rgb '#80b1d3', '' using 6 title columnheader(6) lc rgb '#e6ab02', '' using 7 title columnheader(7) lc rgb '#f0e442', '' using 8 title columnheader(8) lc rgb '#377eb8', '' using 9 title columnheader(9) lc rgb '#e41a1c', '' using 10 title columnheader(10) lc rgb '#333333', '' using 11 title columnheader(11) lc rgb '#a65628', '' using 1:12 with linespoints lw 2 pt 7 lc rgb 'red' title 'cap'
